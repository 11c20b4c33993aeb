//! Model folders that are wrong in every way the loader promises to catch, each giving a
//! clear error that names the problem; and a sharded checkpoint that loads like the single
//! file it was split from. Broken folders are made by rewriting a fixture in a temp dir.

use pagellm::model::reference::ReferenceModel;
use pagellm::model::{ModelError, ModelFiles};
use safetensors::tensor::{Dtype, TensorView};
use serde_json::Value;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

fn fixture(name: &str) -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(name)
}

/// A writable copy of fixture `name` in a fresh temp dir.
fn copy(name: &str, tag: &str) -> PathBuf {
    let dir = std::env::temp_dir().join(format!("pagellm-{tag}-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    std::fs::create_dir_all(&dir).unwrap();
    for e in std::fs::read_dir(fixture(name)).unwrap() {
        let e = e.unwrap();
        std::fs::copy(e.path(), dir.join(e.file_name())).unwrap();
    }
    dir
}

fn edit_config(dir: &Path, f: impl FnOnce(&mut Value)) {
    let p = dir.join("config.json");
    let mut v: Value = serde_json::from_str(&std::fs::read_to_string(&p).unwrap()).unwrap();
    f(&mut v);
    std::fs::write(&p, serde_json::to_string_pretty(&v).unwrap()).unwrap();
}

/// All tensors of a safetensors file as (dtype, shape, bytes).
fn tensors(path: &Path) -> BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)> {
    let bytes = std::fs::read(path).unwrap();
    let st = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    st.tensors()
        .into_iter()
        .map(|(n, t)| (n, (t.dtype(), t.shape().to_vec(), t.data().to_vec())))
        .collect()
}

fn write(path: &Path, map: &BTreeMap<String, (Dtype, Vec<usize>, Vec<u8>)>) {
    let views: Vec<(String, TensorView)> = map
        .iter()
        .map(|(n, (d, s, b))| (n.clone(), TensorView::new(*d, s.clone(), b).unwrap()))
        .collect();
    std::fs::write(path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn err(dir: &Path) -> String {
    let e = ModelFiles::open(dir).expect_err("must fail");
    let _ = std::fs::remove_dir_all(dir);
    e.to_string()
}

#[test]
fn unknown_architecture() {
    let d = copy("llama-gqa", "arch");
    edit_config(&d, |v| v["model_type"] = "gpt2".into());
    let e = err(&d);
    assert!(
        e.contains("unknown architecture") && e.contains("gpt2") && e.contains("LlamaForCausalLM"),
        "{e}"
    );
}

#[test]
fn malformed_config_json() {
    let d = copy("llama-gqa", "json");
    std::fs::write(d.join("config.json"), "{ \"model_type\": \"llama\", ").unwrap();
    let e = err(&d);
    assert!(e.contains("config.json is not valid JSON"), "{e}");
}

#[test]
fn missing_config_field_and_bad_values() {
    let d = copy("llama-gqa", "field");
    edit_config(&d, |v| {
        v.as_object_mut().unwrap().remove("hidden_size");
    });
    assert!(err(&d).contains("missing hidden_size"));
    let d = copy("llama-gqa", "kvheads");
    edit_config(&d, |v| v["num_key_value_heads"] = 3.into());
    let e = err(&d);
    assert!(e.contains("not a multiple of num_key_value_heads 3"), "{e}");
    let d = copy("llama-gqa", "act");
    edit_config(&d, |v| v["hidden_act"] = "gelu".into());
    assert!(err(&d).contains("hidden_act \"gelu\""));
    let d = copy("llama3-rope-scaled", "rope");
    edit_config(&d, |v| v["rope_parameters"]["rope_type"] = "yarn".into());
    assert!(err(&d).contains("rope scaling type \"yarn\""));
}

#[test]
fn shapes_that_disagree_with_config() {
    let d = copy("llama-gqa", "shape");
    edit_config(&d, |v| v["intermediate_size"] = 128.into());
    let e = err(&d);
    assert!(
        e.contains("model.layers.0.mlp.gate_proj.weight has shape [160, 64]")
            && e.contains("[128, 64]"),
        "{e}"
    );
}

#[test]
fn missing_and_extra_tensors() {
    let d = copy("llama-gqa", "missing");
    let mut t = tensors(&d.join("model.safetensors"));
    t.remove("model.layers.1.self_attn.v_proj.weight");
    write(&d.join("model.safetensors"), &t);
    let e = err(&d);
    assert!(
        e.contains("tensor model.layers.1.self_attn.v_proj.weight is missing"),
        "{e}"
    );

    let d = copy("llama-gqa", "extra");
    let mut t = tensors(&d.join("model.safetensors"));
    t.insert(
        "model.layers.0.mystery.weight".into(),
        (Dtype::F32, vec![2], vec![0; 8]),
    );
    write(&d.join("model.safetensors"), &t);
    let e = err(&d);
    assert!(
        e.contains("does not use: model.layers.0.mystery.weight"),
        "{e}"
    );
}

#[test]
fn unsupported_dtype() {
    let d = copy("llama-gqa", "dtype");
    let mut t = tensors(&d.join("model.safetensors"));
    let norm = t.get_mut("model.norm.weight").unwrap();
    *norm = (Dtype::F64, vec![64], vec![0; 64 * 8]);
    write(&d.join("model.safetensors"), &t);
    let e = err(&d);
    assert!(e.contains("model.norm.weight has dtype F64"), "{e}");
}

#[test]
fn truncated_and_missing_weight_files() {
    let d = copy("llama-gqa", "trunc");
    let p = d.join("model.safetensors");
    let bytes = std::fs::read(&p).unwrap();
    std::fs::write(&p, &bytes[..bytes.len() / 2]).unwrap();
    let e = err(&d);
    assert!(
        e.contains("model.safetensors is not a valid safetensors file"),
        "{e}"
    );

    let d = copy("llama-gqa", "noweights");
    std::fs::remove_file(d.join("model.safetensors")).unwrap();
    assert!(err(&d).contains("no weights found"));

    let e = ModelFiles::open(Path::new("/nonexistent/model")).unwrap_err();
    assert!(matches!(e, ModelError::Io { .. }), "{e}");
}

#[test]
fn sharded_checkpoint_loads_like_the_single_file() {
    let d = copy("qwen2-bias-tied", "shards");
    let t = tensors(&d.join("model.safetensors"));
    std::fs::remove_file(d.join("model.safetensors")).unwrap();
    let (mut a, mut b) = (BTreeMap::new(), BTreeMap::new());
    let mut weight_map = serde_json::Map::new();
    for (i, (name, v)) in t.into_iter().enumerate() {
        let shard = if i % 2 == 0 {
            "model-00001-of-00002.safetensors"
        } else {
            "model-00002-of-00002.safetensors"
        };
        weight_map.insert(name.clone(), shard.into());
        if i % 2 == 0 {
            a.insert(name, v)
        } else {
            b.insert(name, v)
        };
    }
    write(&d.join("model-00001-of-00002.safetensors"), &a);
    write(&d.join("model-00002-of-00002.safetensors"), &b);
    let index = serde_json::json!({ "metadata": {}, "weight_map": weight_map });
    std::fs::write(d.join("model.safetensors.index.json"), index.to_string()).unwrap();

    let sharded = ReferenceModel::new(&ModelFiles::open(&d).unwrap()).unwrap();
    let single =
        ReferenceModel::new(&ModelFiles::open(&fixture("qwen2-bias-tied")).unwrap()).unwrap();
    let prompt = [41, 469, 80, 13];
    assert_eq!(sharded.forward(&prompt), single.forward(&prompt));
    let _ = std::fs::remove_dir_all(&d);
}

#[test]
fn transformers4_style_rope_settings_are_read() {
    // transformers 4 writes rope_theta and rope_scaling at the top level.
    let d = copy("llama3-rope-scaled", "tf4");
    edit_config(&d, |v| {
        let p = v["rope_parameters"].clone();
        v.as_object_mut().unwrap().remove("rope_parameters");
        v["rope_theta"] = p["rope_theta"].clone();
        let mut s = p.clone();
        s.as_object_mut().unwrap().remove("rope_theta");
        v["rope_scaling"] = s;
    });
    let a = ModelFiles::open(&d).unwrap().config;
    let b = ModelFiles::open(&fixture("llama3-rope-scaled"))
        .unwrap()
        .config;
    assert_eq!(a, b);
    assert!(
        matches!(a.rope_scaling, pagellm::kernels::rope::RopeScaling::Llama3 { factor, .. } if factor == 8.0)
    );
    let _ = std::fs::remove_dir_all(&d);
}
