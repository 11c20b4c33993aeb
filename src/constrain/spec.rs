//! [`StructuredOutput`]: what a request asks its output to be, as the OpenAI and vLLM APIs
//! and the CLI spell it, turned into one llguidance grammar.

use serde::{Deserialize, Serialize};
use serde_json::{json, Value};

/// The shape a request's output must have. Deserialises from `{"json_schema": {...}}`,
/// `{"json_object": null}`, `{"regex": "..."}`, `{"choice": [...]}` or `{"grammar": "..."}`.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StructuredOutput {
    /// A JSON value valid for this JSON schema (draft 2020-12, as llguidance supports it).
    JsonSchema(Value),
    /// Any JSON object.
    JsonObject,
    /// Text matching this regular expression in full (Rust `regex` syntax).
    Regex(String),
    /// Exactly one of these strings.
    Choice(Vec<String>),
    /// Text derived from this context-free grammar in Lark syntax (llguidance's dialect: a
    /// `start` rule, quoted literals, `/regex/` terminals, `%ignore`).
    Grammar(String),
}

impl StructuredOutput {
    /// The kind, as an API names it (`json_schema`, `regex`, ...), for errors and metrics.
    pub fn kind(&self) -> &'static str {
        match self {
            StructuredOutput::JsonSchema(_) => "json_schema",
            StructuredOutput::JsonObject => "json_object",
            StructuredOutput::Regex(_) => "regex",
            StructuredOutput::Choice(_) => "choice",
            StructuredOutput::Grammar(_) => "grammar",
        }
    }

    /// The llguidance grammar, or what is wrong with the request before compiling.
    pub(super) fn grammar(&self) -> Result<llguidance::api::TopLevelGrammar, String> {
        use llguidance::api::TopLevelGrammar as G;
        Ok(match self {
            StructuredOutput::JsonSchema(schema) => G::from_json_schema(compact(schema.clone())?),
            StructuredOutput::JsonObject => {
                G::from_json_schema(compact(json!({"type": "object"}))?)
            }
            StructuredOutput::Regex(rx) => G::from_regex(rx),
            StructuredOutput::Choice(options) => G::from_lark(choice_grammar(options)?),
            StructuredOutput::Grammar(lark) if lark.trim().is_empty() => {
                return Err("the grammar is empty".into())
            }
            StructuredOutput::Grammar(lark) => G::from_lark(lark.clone()),
        })
    }
}

/// The schema with llguidance's layout settings, unless it brings its own (`x-guidance`):
/// one space after `,` and `:` and no other whitespace, so a model cannot spend its tokens on
/// blank space inside a value (JSON allows unbounded whitespace between tokens).
fn compact(mut schema: Value) -> Result<Value, String> {
    match &mut schema {
        Value::Object(map) => {
            map.entry("x-guidance").or_insert_with(|| {
                json!({"whitespace_flexible": false, "item_separator": ", ", "key_separator": ": "})
            });
            Ok(schema)
        }
        // `true` accepts any JSON value, `false` none; llguidance reads both as objects.
        Value::Bool(true) => compact(json!({})),
        Value::Bool(false) => Err("the JSON schema is `false`, which no value matches".into()),
        other => Err(format!(
            "a JSON schema is an object or a boolean, not {}",
            crate::tokenizer::json_kind(other)
        )),
    }
}

/// `start: "a" | "b"`: each choice a Lark literal (JSON string syntax is Lark's).
fn choice_grammar(options: &[String]) -> Result<String, String> {
    if options.is_empty() {
        return Err("the choice list is empty".into());
    }
    if options.iter().any(String::is_empty) {
        return Err("a choice is the empty string".into());
    }
    let alternatives: Vec<String> = options
        .iter()
        .map(|o| Value::String(o.clone()).to_string())
        .collect();
    Ok(format!("start: {}\n", alternatives.join(" | ")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn choices_become_escaped_literals() {
        let g = choice_grammar(&["yes".into(), "a \"quoted\"\nline".into()]).unwrap();
        assert_eq!(g, "start: \"yes\" | \"a \\\"quoted\\\"\\nline\"\n");
        assert!(choice_grammar(&[]).is_err());
        assert!(choice_grammar(&["".into()]).is_err());
    }

    #[test]
    fn schemas_get_compact_layout_unless_they_choose() {
        let s = compact(json!({"type": "integer"})).unwrap();
        assert_eq!(s["x-guidance"]["whitespace_flexible"], json!(false));
        let own = json!({"type": "integer", "x-guidance": {"whitespace_flexible": true}});
        assert_eq!(compact(own.clone()).unwrap(), own);
        assert!(compact(json!(false)).is_err());
        assert!(compact(json!([1])).unwrap_err().contains("an array"));
        assert_eq!(
            compact(json!(true)).unwrap()["x-guidance"]["key_separator"],
            ": "
        );
    }
}
