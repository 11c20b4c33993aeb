//! GGUF metadata mapped to the model registry: transformers fixtures converted to GGUF by
//! llama.cpp's converter (tools/make_gguf_fixtures.py) give the config their `config.json`
//! gives; files the mapping cannot read are refused by name.

use pagellm::gguf::config::hf_config;
use pagellm::gguf::file::Gguf;
use pagellm::model::{Architecture, ModelConfig};
use std::path::Path;

/// (fixture folder, its GGUF conversion)
const CONVERTED: [&str; 4] = [
    "llama-gqa",
    "llama-bias-mha",
    "mistral-f16",
    "qwen3-qknorm-window",
];

fn from_gguf(path: &Path) -> Result<ModelConfig, String> {
    let bytes = std::fs::read(path).unwrap();
    let file = Gguf::parse(&bytes[..])?;
    let json = hf_config(&file)?;
    ModelConfig::parse(path, &json).map_err(|e| e.to_string())
}

/// `cfg` with full attention in every layer. llama.cpp's converter does not record
/// Qwen3's sliding window (released Qwen3 models do not use it), so a windowed Qwen3
/// converted to GGUF attends to every position, as llama.cpp computes it.
fn without_windows(mut cfg: ModelConfig) -> ModelConfig {
    cfg.recipe.layers.iter_mut().for_each(|l| l.window = None);
    cfg
}

#[test]
fn converted_fixtures_give_the_config_of_their_config_json() {
    for name in CONVERTED {
        let dir = Path::new("tests/fixtures").join(name);
        let want = ModelConfig::from_dir(&dir).unwrap();
        let path = Path::new("tests/fixtures/gguf").join(format!("{name}.gguf"));
        let mut got = from_gguf(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        let want = without_windows(want);
        if want.architecture == Architecture::Mistral {
            // llama.cpp converts Mistral to its `llama` architecture; the fixture's config
            // has no sliding window, so the two compute alike.
            assert_eq!(got.architecture, Architecture::Llama, "{name}");
            got.architecture = Architecture::Mistral;
        }
        assert_eq!(got, want, "{name}");
    }
}

#[test]
fn metadata_the_mapping_cannot_read_is_named() {
    let bytes = std::fs::read("tests/fixtures/gguf/metadata.gguf").unwrap();
    // The metadata fixture says `llama` but has none of its keys.
    let file = Gguf::parse(&bytes[..]).unwrap();
    let e = hf_config(&file).unwrap_err();
    assert!(e.contains("llama.attention.head_count is missing"), "{e}");
    // An architecture of the same length that the registry does not have.
    let at = bytes.windows(5).position(|w| w == b"llama").unwrap();
    let mut other = bytes.clone();
    other[at..at + 5].copy_from_slice(b"bloom");
    let e = hf_config(&Gguf::parse(&other[..]).unwrap()).unwrap_err();
    assert!(
        e.contains("\"bloom\" is not supported") && e.contains("qwen3"),
        "{e}"
    );
}

#[test]
fn a_converted_file_computes_what_its_safetensors_folder_computes() {
    // Every prompt of each fixture through the plain-Rust reference, from the GGUF file
    // (q and k rows put back in Hugging Face order, f32 or f16 as converted) and from the
    // safetensors folder: the logits are the same bits, so the GGUF model generates what
    // transformers generates (tests/golden_reference.rs checks the folder against it).
    use pagellm::model::reference::ReferenceModel;
    use pagellm::model::ModelFiles;
    for name in CONVERTED {
        let dir = Path::new("tests/fixtures").join(name);
        let gguf = Path::new("tests/fixtures/gguf").join(format!("{name}.gguf"));
        let from_gguf = ModelFiles::open(&gguf).unwrap_or_else(|e| panic!("{name}: {e}"));
        let mut from_dir = ModelFiles::open(&dir).unwrap();
        from_dir.config = without_windows(from_dir.config);
        let (a, b) = (
            ReferenceModel::new(&from_gguf).unwrap(),
            ReferenceModel::new(&from_dir).unwrap(),
        );
        let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
        let expected: serde_json::Value = serde_json::from_str(&text).unwrap();
        for case in expected["cases"].as_array().unwrap() {
            let ids: Vec<u32> = case["prompt_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let (got, want) = (a.forward(&ids), b.forward(&ids));
            let same = got
                .iter()
                .flatten()
                .zip(want.iter().flatten())
                .all(|(x, y)| x.to_bits() == y.to_bits());
            assert!(same, "{name}: logits of {ids:?} differ");
        }
    }
}

#[test]
fn a_folder_with_config_json_and_one_gguf_reads_both() {
    use pagellm::model::ModelFiles;
    let src = Path::new("tests/fixtures/llama-gqa");
    let dir = std::env::temp_dir().join(format!("pagellm-gguf-folder-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let gguf = Path::new("tests/fixtures/gguf/llama-gqa.gguf");
    std::fs::copy(gguf, dir.join("model.gguf")).unwrap();
    let files = ModelFiles::open(&dir).unwrap();
    assert_eq!(files.config, ModelConfig::from_dir(src).unwrap());
    assert_eq!(files.dir, dir);
    assert!(files
        .checkpoint
        .contains("model.layers.0.self_attn.q_proj.weight"));
    // Two GGUF files: which one is meant is the user's to say.
    std::fs::copy(gguf, dir.join("other.gguf")).unwrap();
    let e = ModelFiles::open(&dir).unwrap_err().to_string();
    assert!(e.contains("model.gguf, other.gguf"), "{e}");
    std::fs::remove_dir_all(&dir).unwrap();
}

#[test]
fn a_quantized_file_opens_with_its_tensors_in_their_formats() {
    // llama.cpp's q8_0 conversion keeps norms in f32 and stores the projections and the
    // embedding as Q8_0; the model opens with each tensor in its format (tests/quant_model.rs
    // runs it).
    use pagellm::kernels::WeightDtype;
    let path = Path::new("tests/fixtures/gguf/llama-gqa-q8_0.gguf");
    let files = pagellm::model::ModelFiles::open(path).unwrap();
    let ck = &files.checkpoint;
    let q8 = ck
        .names()
        .filter(|n| ck.get(n).unwrap().dtype == WeightDtype::Q8_0)
        .count();
    assert!(q8 >= 7, "{q8} Q8_0 tensors");
    let norm = ck.get("model.layers.0.input_layernorm.weight").unwrap();
    assert_eq!(norm.dtype, WeightDtype::F32);
    assert_eq!(
        from_gguf(path).unwrap(),
        ModelConfig::from_dir(Path::new("tests/fixtures/llama-gqa")).unwrap()
    );
}
