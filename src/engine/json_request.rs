//! A request written as JSON: its prompt and sampling options by the names the server's
//! completions API and vLLM use (`max_tokens`, `temperature`, `stop`, `logprobs`,
//! `json_schema`, ...). The command line's `--prompts-file` lines and the C API's
//! `pagellm_submit_json` read requests this way. Every field but `prompt` is optional
//! and falls back to a base set of parameters; a field this shape does not know is an
//! error naming it, never dropped.

use super::error::EngineError;
use super::intake::Request;
use crate::constrain::StructuredOutput;
use crate::sampling::SamplingParams;
use serde::Deserialize;

/// One or several strings.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum OneOrMany {
    One(String),
    Many(Vec<String>),
}

/// A request as JSON (see the module docs). [`JsonRequest::parse`] reads one;
/// [`JsonRequest::into_request`] makes the engine's request of it.
#[derive(Debug, Clone, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonRequest {
    /// The prompt's text.
    pub prompt: String,
    pub max_tokens: Option<usize>,
    pub temperature: Option<f32>,
    pub top_p: Option<f32>,
    /// -1 or 0: off (vLLM's convention).
    pub top_k: Option<i64>,
    pub min_p: Option<f32>,
    pub seed: Option<u64>,
    pub n: Option<usize>,
    pub beam_width: Option<usize>,
    /// Beam search's score exponent (`cum_logprob / length^length_penalty`).
    pub length_penalty: Option<f32>,
    pub stop: Option<OneOrMany>,
    pub stop_token_ids: Option<Vec<u32>>,
    pub logprobs: Option<usize>,
    pub ignore_eos: Option<bool>,
    pub presence_penalty: Option<f32>,
    pub frequency_penalty: Option<f32>,
    pub repetition_penalty: Option<f32>,
    /// The output must be JSON valid for this schema.
    pub json_schema: Option<serde_json::Value>,
    /// The output must match this regular expression in full.
    pub regex: Option<String>,
    /// The output must be one of these strings.
    pub choice: Option<Vec<String>>,
    /// The output must follow this Lark grammar (llguidance's dialect).
    pub grammar: Option<String>,
    /// Share cached prompt blocks only with requests of the same salt.
    pub cache_salt: Option<String>,
}

impl JsonRequest {
    /// Reads a request from JSON text; an error names what is wrong and where (an unknown
    /// field, a value of the wrong type in a named field).
    pub fn parse(text: &str) -> Result<Self, EngineError> {
        let de = &mut serde_json::Deserializer::from_str(text);
        serde_path_to_error::deserialize(de).map_err(|e| {
            let at = e.path().to_string();
            let what = match at.as_str() {
                "." => e.inner().to_string(),
                _ => format!("{at}: {}", e.inner()),
            };
            EngineError::InvalidRequest(format!("not a valid JSON request: {what}"))
        })
    }

    /// The request's constraint, if it sets one (at most one).
    pub fn structured_output(&self) -> Result<Option<StructuredOutput>, EngineError> {
        let mut set = Vec::new();
        if let Some(s) = &self.json_schema {
            set.push(StructuredOutput::JsonSchema(s.clone()));
        }
        if let Some(r) = &self.regex {
            set.push(StructuredOutput::Regex(r.clone()));
        }
        if let Some(c) = &self.choice {
            set.push(StructuredOutput::Choice(c.clone()));
        }
        if let Some(g) = &self.grammar {
            set.push(StructuredOutput::Grammar(g.clone()));
        }
        if set.len() > 1 {
            return Err(EngineError::InvalidRequest(
                "set at most one of json_schema, regex, choice and grammar".into(),
            ));
        }
        Ok(set.pop())
    }

    /// The sampling parameters: each field the request sets, else `base`'s. They are
    /// checked when the request is submitted.
    pub fn params_over(&self, base: &SamplingParams) -> Result<SamplingParams, EngineError> {
        let structured = self.structured_output()?;
        let top_k = match self.top_k {
            None => base.top_k,
            Some(k) if k > 0 => Some(k as usize),
            Some(-1 | 0) => None,
            Some(k) => {
                return Err(EngineError::InvalidRequest(format!(
                    "top_k must be -1 or 0 (off) or positive, got {k}"
                )))
            }
        };
        Ok(SamplingParams {
            max_tokens: self.max_tokens.unwrap_or(base.max_tokens),
            temperature: self.temperature.unwrap_or(base.temperature),
            top_p: self.top_p.unwrap_or(base.top_p),
            top_k,
            min_p: self.min_p.unwrap_or(base.min_p),
            seed: self.seed.or(base.seed),
            n: self.n.unwrap_or(base.n),
            beam_width: self.beam_width.or(base.beam_width),
            length_penalty: self.length_penalty.unwrap_or(base.length_penalty),
            stop: match &self.stop {
                None => base.stop.clone(),
                Some(OneOrMany::One(s)) => vec![s.clone()],
                Some(OneOrMany::Many(v)) => v.clone(),
            },
            stop_token_ids: (self.stop_token_ids.clone())
                .unwrap_or_else(|| base.stop_token_ids.clone()),
            logprobs: self.logprobs.or(base.logprobs),
            ignore_eos: self.ignore_eos.unwrap_or(base.ignore_eos),
            presence_penalty: self.presence_penalty.unwrap_or(base.presence_penalty),
            frequency_penalty: self.frequency_penalty.unwrap_or(base.frequency_penalty),
            repetition_penalty: self.repetition_penalty.unwrap_or(base.repetition_penalty),
            structured_output: structured.or_else(|| base.structured_output.clone()),
            ..base.clone()
        })
    }

    /// The engine's request: the prompt as text, [`Self::params_over`] `base`, and the
    /// cache salt (an empty one is an error).
    pub fn into_request(self, base: &SamplingParams) -> Result<Request, EngineError> {
        let params = self.params_over(base)?;
        let request = Request::text(self.prompt).with_params(params);
        match self.cache_salt {
            None => Ok(request),
            Some(s) if s.is_empty() => Err(EngineError::InvalidRequest(
                "cache_salt must be a non-empty string when it is given".into(),
            )),
            Some(s) => Ok(request.with_cache_salt(s)),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn base() -> SamplingParams {
        SamplingParams {
            max_tokens: 7,
            temperature: 0.5,
            stop: vec!["base".into()],
            ..SamplingParams::default()
        }
    }

    #[test]
    fn fields_override_the_base_and_the_rest_is_kept() {
        let r = JsonRequest::parse(
            r#"{"prompt": "hi", "max_tokens": 3, "stop": "\n", "top_k": 5, "seed": 9,
                "stop_token_ids": [2], "logprobs": 1, "cache_salt": "u1"}"#,
        )
        .unwrap();
        let p = r.params_over(&base()).unwrap();
        assert_eq!((p.max_tokens, p.temperature), (3, 0.5));
        assert_eq!(p.stop, vec!["\n".to_string()]);
        assert_eq!((p.top_k, p.seed, p.logprobs), (Some(5), Some(9), Some(1)));
        assert_eq!(p.stop_token_ids, vec![2]);
        let request = r.into_request(&base()).unwrap();
        assert_eq!(request.cache_salt.as_deref(), Some("u1"));
        let silent = JsonRequest::parse(r#"{"prompt": "x", "stop": ["a", "b"]}"#).unwrap();
        let p = silent.params_over(&base()).unwrap();
        assert_eq!((p.max_tokens, p.stop.len()), (7, 2));
        for off in ["-1", "0"] {
            let r = JsonRequest::parse(&format!(r#"{{"prompt": "x", "top_k": {off}}}"#)).unwrap();
            assert_eq!(r.params_over(&base()).unwrap().top_k, None);
        }
    }

    #[test]
    fn what_is_wrong_is_named() {
        let err = |text: &str| match JsonRequest::parse(text).and_then(|r| r.into_request(&base()))
        {
            Ok(_) => panic!("{text} was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(err(r#"{"prompt": "x", "temprature": 1}"#).contains("temprature"));
        assert!(err(r#"{"max_tokens": 1}"#).contains("prompt"));
        assert!(err(r#"{"prompt": "x", "max_tokens": "many"}"#).contains("max_tokens"));
        assert!(err(r#"{"prompt": "x", "top_k": -3}"#).contains("top_k"));
        assert!(err(r#"{"prompt": "x", "regex": "a", "choice": ["b"]}"#).contains("at most one"));
        assert!(err(r#"{"prompt": "x", "cache_salt": ""}"#).contains("cache_salt"));
        assert!(err(r#"{"prompt": "#).contains("not a valid JSON request"));
    }
}
