//! Request fields the completions and chat APIs share: sampling (OpenAI's and vLLM's
//! names), stopping and streaming options, and the model name. Each API's request struct
//! flattens these in and adds its own.

use super::error::ApiError;
use super::structured::Structured;
use crate::engine::Request;
use crate::sampling::SamplingParams;
use serde::Deserialize;

#[derive(Debug, Deserialize)]
#[serde(untagged)]
pub enum StopInput {
    One(String),
    Many(Vec<String>),
}

#[derive(Debug, Default, Deserialize)]
pub struct StreamOptions {
    pub include_usage: Option<bool>,
}

/// Fields that only describe the request (OpenAI's `user`, `metadata`, `store`,
/// `service_tier`) and change nothing in its output: accepted and not used.
const INFORMATIVE: &[&str] = &["user", "metadata", "store", "service_tier"];

/// A known field of the wrong type is a 400; so is any field this server does not implement,
/// except the informative ones ([`INFORMATIVE`]): a field that would change the output is
/// never dropped silently.
#[derive(Debug, Default, Deserialize)]
pub struct Common {
    pub model: Option<String>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    pub n: Option<usize>,
    pub stop: Option<StopInput>,
    pub seed: Option<u64>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub stream: Option<bool>,
    pub stream_options: Option<StreamOptions>,
    /// vLLM: -1 (or 0) is off.
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub repetition_penalty: Option<f32>,
    pub ignore_eos: Option<bool>,
    pub stop_token_ids: Option<Vec<u32>>,
    /// vLLM's prefix cache salt: requests share cached prompt blocks only with requests of
    /// the same salt.
    pub cache_salt: Option<String>,
    /// Constraints and logit bias (`structured.rs`).
    #[serde(flatten)]
    pub structured: Structured,
    /// Every field not named above or by the API's own request.
    #[serde(flatten)]
    pub unknown: serde_json::Map<String, serde_json::Value>,
}

impl Common {
    pub fn streamed(&self) -> bool {
        self.stream.unwrap_or(false)
    }

    pub fn include_usage(&self) -> bool {
        self.stream_options
            .as_ref()
            .and_then(|o| o.include_usage)
            .unwrap_or(false)
    }

    /// The engine's parameters, with OpenAI's and vLLM's defaults where the request is
    /// silent; `default_temperature` is 1 except for beam search.
    pub fn params(
        &self,
        max_tokens: usize,
        logprobs: Option<usize>,
        default_temperature: f32,
    ) -> Result<SamplingParams, ApiError> {
        self.check_unknown()?;
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => None,
            Some(k) if k > 0 => Some(k as usize),
            Some(k) => {
                return Err(ApiError::invalid(format!(
                    "top_k must be -1 (off) or positive, got {k}"
                ))
                .with_param("top_k"))
            }
        };
        Ok(SamplingParams {
            n: self.n.unwrap_or(1),
            temperature: self.temperature.unwrap_or(default_temperature),
            top_k,
            top_p: self.top_p.unwrap_or(1.0),
            min_p: self.min_p.unwrap_or(0.0),
            seed: self.seed,
            max_tokens,
            stop: match &self.stop {
                None => Vec::new(),
                Some(StopInput::One(s)) => vec![s.clone()],
                Some(StopInput::Many(v)) => v.clone(),
            },
            stop_token_ids: self.stop_token_ids.clone().unwrap_or_default(),
            ignore_eos: self.ignore_eos.unwrap_or(false),
            logprobs,
            presence_penalty: self.presence_penalty.unwrap_or(0.0),
            frequency_penalty: self.frequency_penalty.unwrap_or(0.0),
            repetition_penalty: self.repetition_penalty.unwrap_or(1.0),
            logit_bias: self.structured.logit_bias()?,
            structured_output: self.structured.structured_output()?,
            ..SamplingParams::default()
        })
    }

    /// The engine's request for prompt `ids` with `params` and this request's salt.
    pub fn request(&self, ids: Vec<u32>, params: SamplingParams) -> Result<Request, ApiError> {
        let request = Request::tokens(ids).with_params(params);
        match self.cache_salt.as_deref() {
            None => Ok(request),
            Some("") => Err(ApiError::invalid(
                "cache_salt must be a non-empty string when it is given",
            )
            .with_param("cache_salt")),
            Some(salt) => Ok(request.with_cache_salt(salt)),
        }
    }

    /// A 400 naming the first field this server does not implement.
    fn check_unknown(&self) -> Result<(), ApiError> {
        match self
            .unknown
            .keys()
            .find(|k| !INFORMATIVE.contains(&k.as_str()))
        {
            Some(k) => Err(ApiError::invalid(format!(
                "the field `{k}` is not supported by this server; without it the request \
                 would not do what it asks, so it is refused rather than ignored"
            ))
            .with_param(k.clone())),
            None => Ok(()),
        }
    }
}
