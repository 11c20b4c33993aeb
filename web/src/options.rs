//! The engine's options as JavaScript passes them (JSON; every field optional, an unknown
//! field an error naming it): the KV cache's size, dtype and preemption, the batch limits.

use pagellm::{EngineConfig, KvDtype, PreemptionMode, WeightDtype};
use serde::Deserialize;

/// Most bytes of prefix-cache records a page keeps unless `prefix_cache_bytes` says
/// otherwise (they are held in the engine's memory as well as in the page's storage).
pub const PREFIX_CACHE_BYTES: u64 = 256 << 20;

/// Options of [`crate::WasmEngine::load`]. Unset fields keep the engine's defaults.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Options {
    /// Tokens per KV block.
    pub block_size: Option<usize>,
    /// Device KV blocks (default: as many as `kv_cache_bytes` holds).
    pub num_gpu_blocks: Option<usize>,
    /// GPU memory for the KV cache, in bytes (default: half the device's largest buffer,
    /// 256 MiB at most; browsers report no free memory).
    pub kv_cache_bytes: Option<u64>,
    /// Host (swap) blocks.
    pub num_cpu_blocks: Option<usize>,
    /// `"f16"`, `"f32"`, `"int8"` or `"int4"`.
    pub kv_dtype: Option<String>,
    /// `"swap"` or `"recompute"` (default: whichever costs less, measured).
    pub preemption_mode: Option<String>,
    pub max_num_seqs: Option<usize>,
    pub max_num_batched_tokens: Option<usize>,
    pub max_model_len: Option<usize>,
    pub enable_prefix_caching: Option<bool>,
    /// Quantize the weights at load: `"f16"`, `"q8_0"`, `"q4_k"`, ...
    pub weight_dtype: Option<String>,
    /// Most bytes of prefix-cache records the page keeps (its disk tier), when it keeps
    /// them; default [`PREFIX_CACHE_BYTES`].
    pub prefix_cache_bytes: Option<u64>,
    /// `"high-performance"` (default) or `"low-power"`: which adapter the page asks for.
    pub power_preference: Option<String>,
}

impl Options {
    /// Reads options from JSON (`""` and `"null"` are the defaults).
    pub fn parse(text: &str) -> Result<Self, String> {
        let text = text.trim();
        if text.is_empty() || text == "null" {
            return Ok(Self::default());
        }
        let de = &mut serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| match e.path().to_string().as_str() {
            "." => format!("options: {}", e.inner()),
            at => format!("options: {at}: {}", e.inner()),
        })
    }

    /// The engine's configuration these options make.
    pub fn engine_config(&self) -> Result<EngineConfig, String> {
        let mut c = EngineConfig::default();
        set(&mut c.block_size, self.block_size);
        if self.num_gpu_blocks.is_some() {
            c.num_gpu_blocks = self.num_gpu_blocks;
        }
        if self.kv_cache_bytes.is_some() {
            c.kv_cache_bytes = self.kv_cache_bytes;
        }
        if self.num_cpu_blocks.is_some() {
            c.num_cpu_blocks = self.num_cpu_blocks;
        }
        if let Some(d) = &self.kv_dtype {
            c.kv_dtype = d
                .parse::<KvDtype>()
                .map_err(|e| format!("options: kv_dtype: {e}"))?;
        }
        c.preemption_mode = match self.preemption_mode.as_deref() {
            None => c.preemption_mode,
            Some("swap") => Some(PreemptionMode::Swap),
            Some("recompute") => Some(PreemptionMode::Recompute),
            Some(other) => {
                return Err(format!(
                    "options: preemption_mode: {other:?} is neither \"swap\" nor \"recompute\""
                ))
            }
        };
        set(&mut c.max_num_seqs, self.max_num_seqs);
        set(&mut c.max_num_batched_tokens, self.max_num_batched_tokens);
        if self.max_model_len.is_some() {
            c.max_model_len = self.max_model_len;
        }
        set(&mut c.enable_prefix_caching, self.enable_prefix_caching);
        // The page's records live in the engine's memory too: a browser's default budget
        // is far below the native disk tier's.
        c.kv_cache_disk_bytes = self.prefix_cache_bytes.unwrap_or(PREFIX_CACHE_BYTES);
        if let Some(w) = &self.weight_dtype {
            let w = w
                .parse::<WeightDtype>()
                .map_err(|e| format!("options: weight_dtype: {e}"))?;
            c.weight_dtype = Some(w);
        }
        Ok(c)
    }

    /// The adapter the page asks for.
    pub fn power_preference(&self) -> pagellm::wgpu::PowerPreference {
        match self.power_preference.as_deref() {
            Some("low-power") => pagellm::wgpu::PowerPreference::LowPower,
            _ => pagellm::wgpu::PowerPreference::HighPerformance,
        }
    }
}

fn set<T>(field: &mut T, value: Option<T>) {
    if let Some(v) = value {
        *field = v;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn options_map_onto_the_engine_config() {
        let o = Options::parse(
            r#"{"num_gpu_blocks": 12, "kv_dtype": "int8", "preemption_mode": "swap",
                "max_num_seqs": 3, "enable_prefix_caching": false}"#,
        )
        .unwrap();
        let c = o.engine_config().unwrap();
        assert_eq!(c.num_gpu_blocks, Some(12));
        assert_eq!(c.kv_dtype, KvDtype::Int8);
        assert_eq!(c.preemption_mode, Some(PreemptionMode::Swap));
        assert_eq!(c.max_num_seqs, 3);
        assert!(!c.enable_prefix_caching);
        let d = EngineConfig::default();
        assert_eq!(c.block_size, d.block_size);
        assert_eq!(c.kv_cache_disk_bytes, PREFIX_CACHE_BYTES);
        assert_eq!(c.kv_cache_bytes, d.kv_cache_bytes);
    }

    #[test]
    fn bad_options_are_errors_naming_the_field() {
        let e = Options::parse(r#"{"num_gpu_block": 12}"#).unwrap_err();
        assert!(e.contains("num_gpu_block"), "{e}");
        let e = Options::parse(r#"{"max_num_seqs": "many"}"#).unwrap_err();
        assert!(e.contains("max_num_seqs"), "{e}");
        let e = Options::parse(r#"{"kv_dtype": "int3"}"#)
            .unwrap()
            .engine_config()
            .unwrap_err();
        assert!(e.contains("kv_dtype") && e.contains("int3"), "{e}");
        let e = Options::parse(r#"{"preemption_mode": "drop"}"#)
            .unwrap()
            .engine_config()
            .unwrap_err();
        assert!(e.contains("preemption_mode"), "{e}");
        assert!(Options::parse("").is_ok() && Options::parse("null").is_ok());
    }
}
