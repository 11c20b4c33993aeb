//! The fixtures llama.cpp's converter wrote to tests/fixtures/gguf
//! (tools/make_gguf_fixtures.py), and the config each computes with in llama.cpp.

#![allow(dead_code)]
use pagellm::internals::model::{Architecture, ModelConfig};
use pagellm::internals::nn::rope::RopeScaling;
use pagellm::internals::nn::Activation;

/// Fixture folders converted to `tests/fixtures/gguf/{name}.gguf`.
pub const CONVERTED: [&str; 12] = [
    "llama-gqa",
    "llama-bias-mha",
    "mistral-f16",
    "qwen3-qknorm-window",
    "llama3-rope-scaled",
    "gemma2-softcap-window",
    "gemma3-local-rope",
    "phi3-longrope-window",
    "mixtral-moe",
    "qwen3-moe-dense-layer",
    "gpt-oss-sinks-moe",
    "gpt-oss-mxfp4",
];

/// A fixture's config as llama.cpp computes it from the converted file, which
/// drops some settings (worked out by hand from llama.cpp's model loader):
///
/// - Qwen3's sliding window is not recorded (released Qwen3 models do not use it), so every
///   layer attends to every position;
/// - Gemma's `query_pre_attn_scalar` is not recorded; below the 27B shapes llama.cpp
///   scales scores by `head_dim^-0.5` (the fixtures' scalars differ from their head sizes,
///   so this is seen);
/// - Gemma 3's layer pattern is not recorded; llama.cpp windows five layers of every six,
///   so all three of the fixture's layers are windowed with the local rope (its
///   config.json makes the last one global);
/// - YaRN's ramp ends are rounded outwards (ggml floors and ceils its correction
///   dimensions), which transformers does only with `truncate` (gpt-oss turns it off);
/// - gpt-oss's SwiGLU limit is not recorded: llama.cpp uses the released models' 7 (the
///   fixture's is 1.5).
pub fn as_llama_cpp(mut cfg: ModelConfig) -> ModelConfig {
    if let RopeScaling::Yarn { truncate, .. } = &mut cfg.rope_scaling {
        *truncate = true;
    }
    if let Activation::ClampedSwiglu { limit, .. } = &mut cfg.recipe.activation {
        *limit = 7.0;
    }
    let head_scale = (cfg.head_dim as f64).powf(-0.5) as f32;
    match cfg.architecture {
        Architecture::Qwen3 => cfg.recipe.layers.iter_mut().for_each(|l| l.window = None),
        Architecture::Gemma2 => cfg.recipe.attn_scale = head_scale,
        Architecture::Gemma3 => {
            cfg.recipe.attn_scale = head_scale;
            let window = cfg.recipe.layers[0].window;
            for (i, l) in cfg.recipe.layers.iter_mut().enumerate() {
                l.window = if (i + 1) % 6 != 0 { window } else { None };
                l.local_rope = (i + 1) % 6 != 0;
            }
        }
        _ => {}
    }
    cfg
}
