//! Model folders that are wrong in every way the loader promises to catch, each giving a
//! clear error that names the problem; and a sharded checkpoint that loads like the single
//! file it was split from. Broken folders are made by rewriting a fixture in a temp dir.

use pagellm::internals::model::reference::ReferenceModel;
use pagellm::internals::model::{ModelError, ModelFiles};
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
    // The message lists what is supported.
    for known in [
        "llama",
        "mistral",
        "qwen2",
        "qwen3",
        "gemma2",
        "gemma3_text",
        "phi3",
    ] {
        assert!(e.contains(known), "{e} should list {known}");
    }
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
    edit_config(&d, |v| v["rope_parameters"]["rope_type"] = "dynamic".into());
    assert!(err(&d).contains("rope scaling type \"dynamic\""));
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
        ReferenceModel::new(&ModelFiles::open(fixture("qwen2-bias-tied")).unwrap()).unwrap();
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
    let b = ModelFiles::open(fixture("llama3-rope-scaled"))
        .unwrap()
        .config;
    assert_eq!(a, b);
    assert!(
        matches!(a.rope_scaling, pagellm::internals::nn::rope::RopeScaling::Llama3 { factor, .. } if factor == 8.0)
    );
    let _ = std::fs::remove_dir_all(&d);
}

/// YaRN's settings as transformers reads them: the attention factor from the factor (or
/// DeepSeek's mscale pair), the original context from the top level before the scaling's
/// own, the factor from the two contexts when it is missing; and the context it serves.
#[test]
fn yarn_settings_are_read_as_transformers_reads_them() {
    use pagellm::internals::nn::rope::RopeScaling;
    let yarn = |edit: &dyn Fn(&mut Value)| {
        let d = copy("llama-yarn", "yarn");
        edit_config(&d, edit);
        let c = ModelFiles::open(&d).unwrap().config;
        let _ = std::fs::remove_dir_all(&d);
        let RopeScaling::Yarn {
            factor,
            original_max_position_embeddings,
            beta_fast,
            beta_slow,
            attention_factor,
            truncate,
        } = c.rope_scaling
        else {
            panic!("not yarn: {:?}", c.rope_scaling);
        };
        (
            [
                factor,
                original_max_position_embeddings,
                beta_fast,
                beta_slow,
                attention_factor,
            ],
            truncate,
            c.max_model_len(),
        )
    };
    let close = |a: f64, b: f64| (a - b).abs() < 1e-12;
    // The fixture as written: factor 4 over 64 of 256 positions.
    let (v, truncate, len) = yarn(&|_| {});
    assert_eq!(v[..4], [4.0, 64.0, 16.0, 1.0]);
    assert!(
        close(v[4], 0.1 * 4f64.ln() + 1.0) && truncate && len == 256,
        "{v:?}"
    );
    // The paper's betas when none are given; DeepSeek's attention factor from mscale
    // 0.707 over mscale_all_dim 0.707... and 1.0.
    let (v, _, _) = yarn(&|c| {
        let p = c["rope_parameters"].as_object_mut().unwrap();
        p.remove("beta_fast");
        p.remove("beta_slow");
        p.insert("mscale".into(), serde_json::json!(1.0));
        p.insert("mscale_all_dim".into(), serde_json::json!(0.5));
        p.insert("truncate".into(), serde_json::json!(false));
    });
    let m = |x: f64| 0.1 * x * 4f64.ln() + 1.0;
    assert_eq!(v[2..4], [32.0, 1.0]);
    assert!(close(v[4], m(1.0) / m(0.5)), "{v:?}");
    // A top-level original context wins over the scaling's; without a factor, it is the
    // ratio of the two contexts.
    let (v, _, _) = yarn(&|c| {
        c["original_max_position_embeddings"] = serde_json::json!(32);
        c["rope_parameters"]
            .as_object_mut()
            .unwrap()
            .remove("factor");
    });
    assert_eq!(v[..2], [8.0, 32.0]);
    assert!(close(v[4], 0.1 * 8f64.ln() + 1.0), "{v:?}");
    // Qwen3's way: the pretrained context kept as max_position_embeddings and YaRN added
    // on top reaches the original context times the factor.
    let (_, _, len) = yarn(&|c| c["max_position_embeddings"] = serde_json::json!(64));
    assert_eq!(len, 256);
}

/// Config errors of known architectures with a feature pagellm does not implement: each
/// names the feature.
#[test]
fn unsupported_features_of_known_architectures_are_named() {
    use serde_json::json;
    type Edit = Box<dyn Fn(&mut Value)>;
    let cases: Vec<(&str, Edit, &str)> = vec![
        (
            "phi3-longrope-window",
            Box::new(|v| v["rope_parameters"]["partial_rotary_factor"] = json!(0.75)),
            "partial_rotary_factor 0.75",
        ),
        (
            "qwen3-qknorm-window",
            Box::new(|v| {
                v["rope_parameters"] =
                    json!({"rope_type": "dynamic", "factor": 4.0, "rope_theta": 1e6})
            }),
            "rope scaling type \"dynamic\"",
        ),
        (
            "llama-yarn",
            Box::new(|v| v["rope_parameters"]["factor"] = json!(-4.0)),
            "yarn scaling needs a positive factor",
        ),
        (
            "llama-yarn",
            Box::new(|v| v["rope_parameters"]["attention_factor"] = json!(0.0)),
            "yarn scaling needs a positive attention_factor",
        ),
        (
            "llama-yarn",
            Box::new(|v| v["rope_parameters"]["beta_slow"] = json!(-1.0)),
            "yarn scaling needs positive beta_fast and beta_slow",
        ),
        (
            "gemma3-local-rope",
            Box::new(|v| v["use_bidirectional_attention"] = json!(true)),
            "bidirectional attention",
        ),
        (
            "gemma2-softcap-window",
            Box::new(|v| v["hidden_activation"] = json!("gelu")),
            "hidden_activation \"gelu\"",
        ),
        (
            "gemma2-softcap-window",
            Box::new(|v| v["layer_types"][1] = json!("chunked_attention")),
            "layer type \"chunked_attention\"",
        ),
        (
            "qwen3-qknorm-window",
            Box::new(|v| v["layer_types"] = json!(["full_attention"])),
            "layer_types must list 3 layer types",
        ),
        (
            "phi3-longrope-window",
            Box::new(|v| v["rope_parameters"]["short_factor"] = json!([1.0, 2.0])),
            "short_factor must list 8 positive numbers",
        ),
    ];
    for (i, (name, edit, want)) in cases.into_iter().enumerate() {
        let dir = copy(name, &format!("feature{i}"));
        edit_config(&dir, edit);
        let e = err(&dir);
        assert!(e.contains(want), "{name}: {e:?} should name {want:?}");
    }
}

/// Fused projections are split along their rows: Phi-3's q, k, v rows of qkv_proj and
/// gate, up rows of gate_up_proj; a fused tensor of the wrong height is a shape error
/// naming it.
#[test]
fn fused_phi3_projections_are_checked_whole() {
    let dir = copy("phi3-longrope-window", "phi3fused");
    let path = dir.join("model.safetensors");
    let mut t = tensors(&path);
    let name = "model.layers.1.self_attn.qkv_proj.weight";
    let (dtype, shape, bytes) = t.remove(name).unwrap();
    assert_eq!(shape, vec![128, 64]);
    let row = bytes.len() / shape[0];
    t.insert(
        name.into(),
        (dtype, vec![127, 64], bytes[..127 * row].to_vec()),
    );
    write(&path, &t);
    let e = err(&dir);
    assert!(e.contains(name) && e.contains("[128, 64]"), "{e}");
}

/// What each family's module reads from config.json, including transformers' defaults for
/// keys a config leaves out and transformers-4 spellings.
#[test]
fn family_recipes_from_config_json() {
    use pagellm::internals::model::arch::NormKind;
    use pagellm::internals::model::ModelConfig;
    use pagellm::internals::nn::rope::RopeScaling;
    use pagellm::internals::nn::Activation;
    use serde_json::json;
    let base = |model_type: &str, layers: usize| {
        json!({"model_type": model_type, "vocab_size": 100, "hidden_size": 64,
               "intermediate_size": 128, "num_hidden_layers": layers,
               "num_attention_heads": 4, "num_key_value_heads": 2})
    };
    let parse = |v: Value| ModelConfig::parse(Path::new("config.json"), &v).unwrap();
    let windows = |c: &ModelConfig| -> Vec<Option<usize>> {
        c.recipe.layers.iter().map(|l| l.window).collect()
    };

    // Gemma 2 with every optional key left out.
    let c = parse(base("gemma2", 4));
    let r = &c.recipe;
    assert_eq!(
        (r.norm, r.activation),
        (NormKind::OnePlusWeight, Activation::GeluTanh)
    );
    assert_eq!((r.attn_softcap, r.final_softcap), (Some(50.0), Some(30.0)));
    assert_eq!(
        r.attn_scale,
        1.0 / 16.0,
        "query_pre_attn_scalar defaults to 256"
    );
    assert_eq!(r.embed_scale, Some(8.0));
    assert!(r.sandwich_norms && !r.qk_norm && c.tie_word_embeddings);
    assert_eq!(windows(&c), [Some(4096), None, Some(4096), None]);
    assert_eq!(
        r.common_window(),
        None,
        "interleaved: no block can be freed"
    );

    // Gemma 3 in transformers-4 spelling: one global layer in six, two rope bases; its
    // attention ignores attn_logit_softcapping, as transformers' does; head_dim 256 when
    // not given.
    let mut v = base("gemma3_text", 12);
    v["attn_logit_softcapping"] = json!(50.0);
    v["final_logit_softcapping"] = json!(30.0);
    v["rope_theta"] = json!(1_000_000.0);
    v["rope_local_base_freq"] = json!(10_000.0);
    v["rope_scaling"] = json!({"rope_type": "linear", "factor": 8.0});
    v["sliding_window"] = json!(512);
    let c = parse(v);
    let global: Vec<usize> = (0..12)
        .filter(|&i| c.recipe.layers[i].window.is_none())
        .collect();
    assert_eq!(global, [5, 11]);
    assert!(c.recipe.layers[0].local_rope && !c.recipe.layers[5].local_rope);
    assert_eq!(c.rope_theta, 1e6);
    assert_eq!(c.rope_scaling, RopeScaling::Linear { factor: 8.0 });
    let local = c.layer_rope(0);
    assert_eq!((local.theta, local.scaling), (10_000.0, RopeScaling::None));
    assert!(c.recipe.qk_norm && c.recipe.attn_softcap.is_none());
    assert_eq!((c.recipe.final_softcap, c.head_dim), (Some(30.0), 256));
    // A null window: the sliding-type layers attend to everything but keep the local rope.
    let mut v = base("gemma3_text", 6);
    v["sliding_window"] = Value::Null;
    let c = parse(v);
    assert_eq!(windows(&c), [None; 6]);
    let local: Vec<bool> = c.recipe.layers.iter().map(|l| l.local_rope).collect();
    assert_eq!(local, [true, true, true, true, true, false]);

    // Qwen2/Qwen3: windows from max_window_layers on, only with use_sliding_window.
    let mut v = base("qwen2", 4);
    v["use_sliding_window"] = json!(true);
    v["sliding_window"] = json!(32);
    v["max_window_layers"] = json!(2);
    let c = parse(v.clone());
    assert_eq!(windows(&c), [None, None, Some(32), Some(32)]);
    assert!(c.qkv_bias && !c.o_bias);
    v["model_type"] = json!("qwen3");
    v["use_sliding_window"] = json!(false);
    let c = parse(v.clone());
    assert_eq!(windows(&c), [None; 4]);
    assert!(c.recipe.qk_norm && !c.qkv_bias);
    assert_eq!(c.head_dim, 128, "Qwen3's default head_dim");
    // use_sliding_window with a null window, or layer_types listing sliding layers without
    // use_sliding_window: full attention everywhere, as in transformers.
    v["use_sliding_window"] = json!(true);
    v["sliding_window"] = Value::Null;
    assert_eq!(windows(&parse(v.clone())), [None; 4]);
    v["use_sliding_window"] = json!(false);
    v["sliding_window"] = json!(32);
    v["layer_types"] = json!([
        "full_attention",
        "full_attention",
        "sliding_attention",
        "sliding_attention"
    ]);
    assert_eq!(windows(&parse(v)), [None; 4]);

    // Mistral: transformers' default window when the key is absent, none when null; every
    // layer slides whatever layer_types says (transformers ignores it for Mistral).
    let mut v = base("mistral", 2);
    v["max_position_embeddings"] = json!(32768);
    v["layer_types"] = json!(["full_attention", "sliding_attention"]);
    let c = parse(v);
    assert_eq!(c.recipe.common_window(), Some(4096));
    assert_eq!(
        c.max_model_len(),
        32768,
        "the window no longer caps the context"
    );
    assert_eq!(
        parse(base("mistral", 2)).max_model_len(),
        131072,
        "transformers' default"
    );
    let mut v = base("mistral", 2);
    v["sliding_window"] = Value::Null;
    assert_eq!(parse(v).recipe.common_window(), None);

    // Phi-3 LongRoPE: attention factor from the context's growth; the default context is
    // the original length the short factors are for, a longer one takes the long factors.
    let mut v = base("phi3", 2);
    v["max_position_embeddings"] = json!(131072);
    v["original_max_position_embeddings"] = json!(4096);
    let short: Vec<f64> = (0..8).map(|i| 1.0 + i as f64).collect();
    let long: Vec<f64> = (0..8).map(|i| 2.0 + 4.0 * i as f64).collect();
    v["rope_scaling"] = json!({"type": "su", "short_factor": short, "long_factor": long});
    let c = parse(v);
    assert_eq!(c.rms_norm_eps, 1e-5, "Phi-3's default eps");
    let RopeScaling::LongRope {
        attention_factor,
        original_max_position_embeddings,
        long: false,
        ..
    } = c.rope_scaling.clone()
    else {
        panic!("{:?}", c.rope_scaling)
    };
    let want = (1.0 + 32f64.ln() / 4096f64.ln()).sqrt();
    assert!((attention_factor - want).abs() < 1e-12);
    assert_eq!(original_max_position_embeddings, 4096);
    assert_eq!((c.default_context(), c.max_model_len()), (4096, 131072));
    use pagellm::internals::nn::rope::inv_freq;
    // transformers: inv_freq[i] = 1 / (factor[i] * theta^(2i/d)), d = 16, theta 1e4.
    let plain = inv_freq(16, 10000.0, &RopeScaling::None);
    for (context, factors) in [(4096, &short), (4097, &long)] {
        let s = c.for_context(context).rope_scaling;
        for (i, (&got, &p)) in inv_freq(16, 10000.0, &s).iter().zip(&plain).enumerate() {
            let want = p / factors[i] as f32;
            assert!(
                (got - want).abs() <= 1e-6 * want,
                "context {context} pair {i}"
            );
        }
    }
}

#[test]
fn mixture_of_experts_settings_are_read_as_transformers_reads_them() {
    use pagellm::internals::model::arch::{Moe, Routing};
    use pagellm::internals::model::ModelConfig;
    use serde_json::json;
    let base = |model_type: &str| {
        json!({"model_type": model_type, "vocab_size": 100, "hidden_size": 64,
               "intermediate_size": 128, "num_hidden_layers": 4,
               "num_attention_heads": 4, "num_key_value_heads": 2})
    };
    let parse = |v: Value| ModelConfig::parse(Path::new("config.json"), &v);
    let sparse =
        |c: &ModelConfig| -> Vec<bool> { c.recipe.layers.iter().map(|l| l.sparse).collect() };

    // Mixtral: transformers' defaults (8 experts, 2 per token) and the alias num_experts.
    let c = parse(base("mixtral")).unwrap();
    let moe = |experts, top_k, intermediate, renormalize| Moe {
        experts,
        top_k,
        intermediate,
        routing: Routing::SoftmaxTopK { renormalize },
        biased: false,
    };
    assert_eq!(c.recipe.moe, Some(moe(8, 2, 128, true)), "defaults");
    assert_eq!(sparse(&c), [true; 4]);
    let mut v = base("mixtral");
    v["num_experts"] = json!(6);
    v["num_experts_per_tok"] = json!(3);
    assert_eq!(parse(v).unwrap().recipe.moe, Some(moe(6, 3, 128, true)));

    // Qwen3-MoE: 128 experts, 8 per token, width 768, no renormalisation by default;
    // num_local_experts is its alias; dense layers by mlp_only_layers and by the step.
    let c = parse(base("qwen3_moe")).unwrap();
    assert_eq!(c.recipe.moe, Some(moe(128, 8, 768, false)));
    assert!(c.recipe.qk_norm);
    assert_eq!(c.head_dim, 16, "hidden / heads when head_dim is not given");
    let mut v = base("qwen3_moe");
    v["num_local_experts"] = json!(16);
    v["num_experts_per_tok"] = json!(4);
    v["moe_intermediate_size"] = json!(32);
    v["norm_topk_prob"] = json!(true);
    v["mlp_only_layers"] = json!([0]);
    v["decoder_sparse_step"] = json!(2);
    let c = parse(v).unwrap();
    assert_eq!(c.recipe.moe, Some(moe(16, 4, 32, true)));
    assert_eq!(sparse(&c), [false, true, false, true]);

    // Bad values are named.
    let bad = |edit: &dyn Fn(&mut Value), want: &str| {
        let mut v = base("qwen3_moe");
        edit(&mut v);
        let e = parse(v).expect_err(want).to_string();
        assert!(e.contains(want), "{e} (wanted {want:?})");
    };
    bad(
        &|v| v["num_experts_per_tok"] = json!(200),
        "exceeds the number of experts",
    );
    bad(
        &|v| {
            v["num_experts"] = json!(8);
            v["num_local_experts"] = json!(16);
        },
        "disagree",
    );
    bad(&|v| v["num_experts"] = json!(512), "up to 256 experts");
    bad(
        &|v| v["num_experts"] = json!(0),
        "num_experts must be a positive integer",
    );
    bad(
        &|v| v["mlp_only_layers"] = json!("all"),
        "mlp_only_layers must list",
    );
}

#[test]
fn expert_tensors_that_disagree_with_the_config_are_named() {
    use serde_json::json;
    // An expert count that disagrees with the checkpoint: the router's shape says so.
    for n in [3, 5] {
        let dir = copy("mixtral-moe", &format!("moe-count{n}"));
        edit_config(&dir, |v| v["num_local_experts"] = json!(n));
        let e = err(&dir);
        let want = format!(
            "block_sparse_moe.gate.weight has shape [4, 64], but config.json implies [{n}, 64]"
        );
        assert!(e.contains(&want), "{e}");
    }
    // Experts missing beside a router of the right shape: the first missing one is named.
    let dir = copy("mixtral-moe", "moe-missing");
    let path = dir.join("model.safetensors");
    let mut map = tensors(&path);
    map.remove("model.layers.1.block_sparse_moe.experts.2.w3.weight");
    write(&path, &map);
    let e = err(&dir);
    assert!(
        e.contains("model.layers.1.block_sparse_moe.experts.2.w3.weight"),
        "{e}"
    );
    // A router of the wrong shape.
    let dir = copy("qwen3-moe-dense-layer", "moe-router");
    let path = dir.join("model.safetensors");
    let mut map = tensors(&path);
    let (d, shape, bytes) = map.remove("model.layers.0.mlp.gate.weight").unwrap();
    assert_eq!(shape, [8, 64]);
    map.insert(
        "model.layers.0.mlp.gate.weight".into(),
        (d, vec![4, 64], bytes[..bytes.len() / 2].to_vec()),
    );
    write(&path, &map);
    let e = err(&dir);
    assert!(
        e.contains("model.layers.0.mlp.gate.weight") && e.contains("[8, 64]"),
        "{e}"
    );
    // The dense layer of a Qwen3-MoE declared sparse: its router is missing.
    let dir = copy("qwen3-moe-dense-layer", "moe-dense");
    edit_config(&dir, |v| v["mlp_only_layers"] = json!([]));
    let e = err(&dir);
    assert!(
        e.contains("model.layers.1.mlp.gate.weight is missing"),
        "{e}"
    );
}

#[test]
fn gpt_oss_settings_and_stacked_experts() {
    use pagellm::internals::model::arch::Routing;
    use pagellm::internals::model::ModelConfig;
    use pagellm::internals::nn::rope::RopeScaling;
    use pagellm::internals::nn::Activation;
    use serde_json::json;
    // transformers' defaults: 128 experts, 4 per token, windows of 128 on every other layer
    // from the first, YaRN x32 over 4096 positions (truncate off), rope base 150000, biases
    // on attention, the clamped SwiGLU at 1.702 / 7.
    let v = json!({"model_type": "gpt_oss", "vocab_size": 100, "hidden_size": 64,
                   "intermediate_size": 64, "num_hidden_layers": 4,
                   "num_attention_heads": 4, "num_key_value_heads": 2});
    let c = ModelConfig::parse(Path::new("config.json"), &v).unwrap();
    let moe = c.recipe.moe.unwrap();
    assert_eq!(
        (moe.experts, moe.top_k, moe.routing, moe.biased),
        (128, 4, Routing::TopKSoftmax, true)
    );
    let windows: Vec<Option<usize>> = c.recipe.layers.iter().map(|l| l.window).collect();
    assert_eq!(windows, [Some(128), None, Some(128), None]);
    assert_eq!(c.rope_theta, 150000.0);
    assert!(matches!(
        c.rope_scaling,
        RopeScaling::Yarn {
            factor: 32.0,
            truncate: false,
            ..
        }
    ));
    assert_eq!(c.head_dim, 64);
    assert!(c.qkv_bias && c.o_bias && c.recipe.attn_sinks);
    assert_eq!(
        c.recipe.activation,
        Activation::ClampedSwiglu {
            alpha: 1.702,
            limit: 7.0
        }
    );

    // A stacked expert tensor of the wrong shape is named with both shapes.
    let dir = copy("gpt-oss-sinks-moe", "gptoss-shape");
    let path = dir.join("model.safetensors");
    let mut map = tensors(&path);
    let name = "model.layers.1.mlp.experts.down_proj";
    let (d, shape, bytes) = map.remove(name).unwrap();
    assert_eq!(shape, [4, 32, 64]);
    map.insert(name.into(), (d, vec![4, 64, 32], bytes));
    write(&path, &map);
    let e = err(&dir);
    assert!(e.contains(name) && e.contains("[4, 32, 64]"), "{e}");
    // Without the stacked tensors and without per-expert ones: the first missing is named.
    let dir = copy("gpt-oss-sinks-moe", "gptoss-missing");
    let path = dir.join("model.safetensors");
    let mut map = tensors(&path);
    map.retain(|n, _| !n.starts_with("model.layers.0.mlp.experts"));
    write(&path, &map);
    let e = err(&dir);
    assert!(e.contains("model.layers.0.mlp.experts.0.gate_proj"), "{e}");
}
