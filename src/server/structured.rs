//! The request fields that constrain or bias the output: OpenAI's `response_format` and
//! `logit_bias`, vLLM's `structured_outputs` object and its older `guided_json`,
//! `guided_regex`, `guided_choice` and `guided_grammar`. A request sets at most one
//! constraint; each becomes a [`StructuredOutput`] the engine compiles (where a schema or
//! grammar that does not compile is a 400 naming the problem).

use super::error::ApiError;
use crate::constrain::StructuredOutput;
use serde::Deserialize;
use serde_json::Value;
use std::collections::BTreeMap;

/// OpenAI's `response_format`.
#[derive(Debug, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum ResponseFormat {
    Text,
    JsonObject,
    JsonSchema { json_schema: JsonSchemaFormat },
}

/// `response_format.json_schema`: the schema and OpenAI's descriptive fields. `strict` is
/// accepted either way: the schema is always enforced.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct JsonSchemaFormat {
    #[allow(dead_code)]
    pub name: Option<String>,
    #[allow(dead_code)]
    pub description: Option<String>,
    pub schema: Option<Value>,
    #[allow(dead_code)]
    pub strict: Option<bool>,
}

/// vLLM's `structured_outputs` (its `StructuredOutputsParams`): exactly one of these.
#[derive(Debug, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StructuredOutputs {
    pub json: Option<Value>,
    pub regex: Option<String>,
    pub choice: Option<Vec<String>>,
    pub grammar: Option<String>,
    pub json_object: Option<bool>,
    /// vLLM: fail instead of falling back to another backend; there is only one here.
    #[allow(dead_code)]
    pub disable_fallback: Option<bool>,
}

/// The constraining fields of a request body (flattened into the shared fields).
#[derive(Debug, Default, Deserialize)]
pub struct Structured {
    pub response_format: Option<ResponseFormat>,
    pub structured_outputs: Option<StructuredOutputs>,
    pub guided_json: Option<Value>,
    pub guided_regex: Option<String>,
    pub guided_choice: Option<Vec<String>>,
    pub guided_grammar: Option<String>,
    /// vLLM's backend choice; llguidance is the only one, and any name is accepted.
    #[allow(dead_code)]
    pub guided_decoding_backend: Option<String>,
    /// Token id (as a string, OpenAI's shape) to a bias in [-100, 100].
    pub logit_bias: Option<BTreeMap<String, f32>>,
}

/// A schema given as a JSON object, or as a string holding one (vLLM accepts both).
fn schema_value(v: &Value, param: &str) -> Result<Value, ApiError> {
    match v {
        Value::String(s) => serde_json::from_str(s).map_err(|e| {
            ApiError::invalid(format!("`{param}` is a string that is not JSON: {e}"))
                .with_param(param)
        }),
        other => Ok(other.clone()),
    }
}

/// A Lark grammar; GBNF (`::=` rules, llama.cpp's format) is named as such.
fn grammar(text: &str, param: &str) -> Result<StructuredOutput, ApiError> {
    if text.contains("::=") {
        return Err(ApiError::invalid(format!(
            "`{param}` looks like a GBNF grammar (`::=`); write it in Lark syntax \
             (`rule: ...`, with a `start` rule)"
        ))
        .with_param(param));
    }
    Ok(StructuredOutput::Grammar(text.to_string()))
}

impl Structured {
    /// The request's constraint, from whichever field sets it; two fields that each set one
    /// are a 400 naming both.
    pub fn structured_output(&self) -> Result<Option<StructuredOutput>, ApiError> {
        let mut found: Vec<(&str, StructuredOutput)> = Vec::new();
        match &self.response_format {
            None | Some(ResponseFormat::Text) => {}
            Some(ResponseFormat::JsonObject) => {
                found.push(("response_format", StructuredOutput::JsonObject))
            }
            Some(ResponseFormat::JsonSchema { json_schema }) => {
                let Some(schema) = &json_schema.schema else {
                    return Err(
                        ApiError::invalid("response_format.json_schema has no `schema`")
                            .with_param("response_format"),
                    );
                };
                let s = schema_value(schema, "response_format")?;
                found.push(("response_format", StructuredOutput::JsonSchema(s)));
            }
        }
        if let Some(so) = &self.structured_outputs {
            found.extend(so.outputs()?.into_iter().map(|o| ("structured_outputs", o)));
        }
        if let Some(v) = &self.guided_json {
            let s = schema_value(v, "guided_json")?;
            found.push(("guided_json", StructuredOutput::JsonSchema(s)));
        }
        if let Some(r) = &self.guided_regex {
            found.push(("guided_regex", StructuredOutput::Regex(r.clone())));
        }
        if let Some(c) = &self.guided_choice {
            found.push(("guided_choice", StructuredOutput::Choice(c.clone())));
        }
        if let Some(g) = &self.guided_grammar {
            found.push(("guided_grammar", grammar(g, "guided_grammar")?));
        }
        match found.len() {
            0 | 1 => Ok(found.pop().map(|(_, o)| o)),
            _ => {
                let names: Vec<&str> = found.iter().map(|(n, _)| *n).collect();
                Err(ApiError::invalid(format!(
                    "set one constraint, not several: {}",
                    names.join(", ")
                ))
                .with_param(names[1]))
            }
        }
    }

    /// `logit_bias` as (token id, bias) pairs; the engine checks ids and ranges.
    pub fn logit_bias(&self) -> Result<Vec<(u32, f32)>, ApiError> {
        let Some(map) = &self.logit_bias else {
            return Ok(Vec::new());
        };
        map.iter()
            .map(|(k, &v)| match k.trim().parse::<u32>() {
                Ok(id) => Ok((id, v)),
                Err(_) => Err(ApiError::invalid(format!(
                    "logit_bias keys are token ids, not `{k}`"
                ))
                .with_param("logit_bias")),
            })
            .collect()
    }
}

impl StructuredOutputs {
    fn outputs(&self) -> Result<Vec<StructuredOutput>, ApiError> {
        let mut out = Vec::new();
        if let Some(v) = &self.json {
            out.push(StructuredOutput::JsonSchema(schema_value(
                v,
                "structured_outputs",
            )?));
        }
        if let Some(r) = &self.regex {
            out.push(StructuredOutput::Regex(r.clone()));
        }
        if let Some(c) = &self.choice {
            out.push(StructuredOutput::Choice(c.clone()));
        }
        if let Some(g) = &self.grammar {
            out.push(grammar(g, "structured_outputs")?);
        }
        if self.json_object == Some(true) {
            out.push(StructuredOutput::JsonObject);
        }
        if out.is_empty() {
            return Err(ApiError::invalid(
                "structured_outputs sets none of json, regex, choice, grammar, json_object",
            )
            .with_param("structured_outputs"));
        }
        Ok(out)
    }
}
