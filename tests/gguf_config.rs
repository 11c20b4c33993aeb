//! GGUF metadata mapped to the model registry: transformers fixtures converted to GGUF by
//! llama.cpp's converter (tools/make_gguf_fixtures.py) give the config their `config.json`
//! gives; files the mapping cannot read are refused by name.

mod common;
use common::converted::{as_llama_cpp, CONVERTED};
use pagellm::internals::gguf::config::hf_config;
use pagellm::internals::gguf::file::Gguf;
use pagellm::internals::model::{Architecture, ModelConfig};
use pagellm::internals::nn::rope::RopeScaling;
use std::path::Path;

fn from_gguf(path: &Path) -> Result<ModelConfig, String> {
    let bytes = std::fs::read(path).unwrap();
    let file = Gguf::parse(&bytes[..])?;
    let json = hf_config(&file)?;
    ModelConfig::parse(path, &json).map_err(|e| e.to_string())
}

/// Llama 3's rope scaling arrives as per-frequency factors (`rope_freqs.weight`, which
/// the converter computed in f64 from the same parameters), so the frequencies agree with
/// transformers' to f32 rounding rather than bit for bit; then the rest of `got` must be
/// `want`.
fn same_frequencies(got: &mut ModelConfig, want: &ModelConfig) {
    use pagellm::internals::nn::rope::inv_freq;
    let (a, b) = (
        inv_freq(got.head_dim, got.rope_theta, &got.rope_scaling),
        inv_freq(want.head_dim, want.rope_theta, &want.rope_scaling),
    );
    for (i, (x, y)) in a.iter().zip(&b).enumerate() {
        assert!((x - y).abs() <= y.abs() * 2e-7, "frequency {i}: {x} vs {y}");
    }
    got.rope_scaling = want.rope_scaling.clone();
}

#[test]
fn converted_fixtures_give_the_config_of_their_config_json() {
    for name in CONVERTED {
        let dir = Path::new("tests/fixtures").join(name);
        let want = as_llama_cpp(ModelConfig::from_dir(&dir).unwrap());
        let path = Path::new("tests/fixtures/gguf").join(format!("{name}.gguf"));
        let mut got = from_gguf(&path).unwrap_or_else(|e| panic!("{name}: {e}"));
        if want.architecture == Architecture::Mistral {
            // llama.cpp converts Mistral to its `llama` architecture; the fixture's config
            // has no sliding window, so the two compute alike.
            assert_eq!(got.architecture, Architecture::Llama, "{name}");
            got.architecture = Architecture::Mistral;
        }
        if name == "llama3-rope-scaled" {
            same_frequencies(&mut got, &want);
        }
        // The file stores Phi-3's attention factor in f32, the precision the model computes
        // with (RopeScaling::attention_factor).
        assert_eq!(
            got.rope_scaling.attention_factor(),
            want.rope_scaling.attention_factor()
        );
        if let (
            RopeScaling::LongRope {
                attention_factor: a,
                ..
            },
            RopeScaling::LongRope {
                attention_factor: b,
                ..
            },
        ) = (&mut got.rope_scaling, &want.rope_scaling)
        {
            *a = *b;
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
        e.contains("\"bloom\" is not supported") && e.contains("phi3"),
        "{e}"
    );
}

/// The prompts of fixture `dir`'s expected.json.
fn prompts(dir: &Path) -> Vec<Vec<u32>> {
    let text = std::fs::read_to_string(dir.join("expected.json")).unwrap();
    let expected: serde_json::Value = serde_json::from_str(&text).unwrap();
    expected["cases"]
        .as_array()
        .unwrap()
        .iter()
        .map(|case| {
            case["prompt_ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect()
        })
        .collect()
}

/// A folder holding fixture `name`'s config.json and tokenizer.json beside its GGUF file.
fn folder_with_gguf(name: &str) -> std::path::PathBuf {
    let src = Path::new("tests/fixtures").join(name);
    let dir = std::env::temp_dir().join(format!("pagellm-gguf-{name}-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    for f in ["config.json", "tokenizer.json"] {
        std::fs::copy(src.join(f), dir.join(f)).unwrap();
    }
    let gguf = Path::new("tests/fixtures/gguf").join(format!("{name}.gguf"));
    std::fs::copy(gguf, dir.join("model.gguf")).unwrap();
    dir
}

#[test]
fn a_converted_file_computes_what_its_safetensors_folder_computes() {
    // Every prompt of each fixture through the plain-Rust reference, from the GGUF file
    // (q and k rows put back in Hugging Face order, Gemma's norms un-shifted, f32 or f16
    // as converted) and from the safetensors folder, with the config llama.cpp computes
    // with: the logits are the same bits, so the GGUF model computes what transformers
    // computes (tests/golden_reference.rs checks the folder against it). The same GGUF
    // beside the fixture's config.json computes what the folder computes unchanged.
    use pagellm::internals::model::reference::ReferenceModel;
    use pagellm::internals::model::ModelFiles;
    let same_bits = |a: &[Vec<f32>], b: &[Vec<f32>]| {
        a.iter()
            .flatten()
            .zip(b.iter().flatten())
            .all(|(x, y)| x.to_bits() == y.to_bits())
    };
    for name in CONVERTED {
        let dir = Path::new("tests/fixtures").join(name);
        let gguf = Path::new("tests/fixtures/gguf").join(format!("{name}.gguf"));
        let from_gguf = ModelFiles::open(&gguf).unwrap_or_else(|e| panic!("{name}: {e}"));
        let with_config = folder_with_gguf(name);
        let beside_config = ModelFiles::open(&with_config).unwrap();
        std::fs::remove_dir_all(&with_config).unwrap();
        let from_dir = ModelFiles::open(&dir).unwrap();
        let mut as_converted = ModelFiles::open(&dir).unwrap();
        as_converted.config = as_llama_cpp(as_converted.config);
        let model = |f: &ModelFiles| ReferenceModel::new(f).unwrap();
        let (a, b) = (model(&from_gguf), model(&as_converted));
        let (c, d) = (model(&beside_config), model(&from_dir));
        for ids in prompts(&dir) {
            let (got, want) = (a.forward(&ids), b.forward(&ids));
            if name == "llama3-rope-scaled" {
                // Frequencies within f32 rounding (see same_frequencies).
                let worst = got
                    .iter()
                    .flatten()
                    .zip(want.iter().flatten())
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0f32, f32::max);
                assert!(worst < 1e-4, "{name}: logits of {ids:?} differ by {worst}");
            } else {
                assert!(same_bits(&got, &want), "{name}: logits of {ids:?} differ");
            }
            let (got, want) = (c.forward(&ids), d.forward(&ids));
            assert!(same_bits(&got, &want), "{name} with config.json: {ids:?}");
        }
    }
}

#[test]
fn a_folder_with_config_json_and_one_gguf_reads_both() {
    use pagellm::internals::model::ModelFiles;
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
    use pagellm::internals::kernels::WeightDtype;
    let path = Path::new("tests/fixtures/gguf/llama-gqa-q8_0.gguf");
    let files = pagellm::internals::model::ModelFiles::open(path).unwrap();
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

/// A GGUF model with a tensor of a type pagellm has no decoder for (IQ2_XXS): the error names
/// the file as GGUF and the type (it once called the file a malformed safetensors file).
#[test]
fn a_tensor_type_without_a_decoder_is_named_as_such() {
    let path = Path::new("tests/fixtures/gguf/llama-gqa-q8_0.gguf");
    let bytes = std::fs::read(path).unwrap();
    // output.weight's directory entry: name, 2 dimensions, 2 extents, then its type (Q8_0).
    let name = b"output.weight";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    assert_eq!(bytes[at..at + 4], 2u32.to_le_bytes());
    let ty = at + 4 + 2 * 8;
    assert_eq!(bytes[ty..ty + 4], 8u32.to_le_bytes(), "Q8_0");
    let mut retyped = bytes.clone();
    retyped[ty..ty + 4].copy_from_slice(&16u32.to_le_bytes()); // IQ2_XXS
    let dir = std::env::temp_dir().join(format!("pagellm-iq2xxs-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("model.gguf");
    std::fs::write(&file, retyped).unwrap();
    let e = pagellm::internals::model::ModelFiles::open(&file)
        .unwrap_err()
        .to_string();
    std::fs::remove_dir_all(&dir).unwrap();
    assert!(
        e.contains("GGUF") && e.contains("IQ2_XXS (id 16) is not supported"),
        "{e}"
    );
    assert!(!e.contains("safetensors"), "{e}");
}

#[test]
fn rope_factors_that_are_not_a_list_of_f32_are_named() {
    // llama3-rope-scaled.gguf with its rope_freqs.weight retyped F16 in the tensor
    // directory (name, 1 dimension, 8 extents, type).
    let bytes = std::fs::read("tests/fixtures/gguf/llama3-rope-scaled.gguf").unwrap();
    let name = b"rope_freqs.weight";
    let at = bytes.windows(name.len()).position(|w| w == name).unwrap() + name.len();
    assert_eq!(bytes[at..at + 4], 1u32.to_le_bytes());
    assert_eq!(bytes[at + 4..at + 12], 8u64.to_le_bytes());
    let mut retyped = bytes.clone();
    retyped[at + 12..at + 16].copy_from_slice(&1u32.to_le_bytes());
    let e = hf_config(&Gguf::parse(&retyped[..]).unwrap()).unwrap_err();
    assert!(e.contains("rope_freqs.weight is a F16 tensor"), "{e}");
    // The file as written reads as per-frequency factors: 1 for the shortest wavelength,
    // the full factor 8 for the longest.
    let json = hf_config(&Gguf::parse(&bytes[..]).unwrap()).unwrap();
    let f = json["rope_scaling"]["short_factor"].as_array().unwrap();
    assert_eq!((f[0].as_f64(), f[7].as_f64()), (Some(1.0), Some(8.0)));
}
