//! Chat templates rendered by pagellm equal transformers' `apply_chat_template` (text and
//! token ids) for every template and conversation in `tests/fixtures/chat/expected.json`
//! (made by `tools/make_chat_fixtures.py`), including the template's own error.

use pagellm::internals::tokenizer::{ChatMessage, ChatTemplate, RenderOptions, Tokenizer};
use serde_json::Value;
use std::path::Path;

fn fixture() -> Value {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat/expected.json");
    serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap()
}

fn messages(v: &Value) -> Vec<ChatMessage> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|m| ChatMessage {
            tool_calls: m.get("tool_calls").map(|c| c.as_array().unwrap().clone()),
            tool_call_id: m.get("tool_call_id").map(|c| c.as_str().unwrap().into()),
            ..ChatMessage::new(m["role"].as_str().unwrap(), m["content"].as_str().unwrap())
        })
        .collect()
}

#[test]
fn templates_render_as_transformers_renders_them() {
    let f = fixture();
    let tok = Tokenizer::from_dir(
        &Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama-gqa"),
    )
    .unwrap();
    let (bos, eos) = (
        f["bos_token"].as_str().unwrap(),
        f["eos_token"].as_str().unwrap(),
    );
    let mut checked = 0;
    for case in f["cases"].as_array().unwrap() {
        let name = case["template"].as_str().unwrap();
        let t = ChatTemplate::new(f["templates"][name].as_str().unwrap(), bos, eos).unwrap();
        let msgs = messages(&f["conversations"][case["conversation"].as_u64().unwrap() as usize]);
        let agp = case["add_generation_prompt"].as_bool().unwrap();
        let what = format!("{name} conversation {} agp {agp}", case["conversation"]);
        match (t.render(&msgs, agp), case.get("error")) {
            (Ok(text), None) => {
                assert_eq!(text, case["text"].as_str().unwrap(), "{what}");
                let ids: Vec<u32> = case["ids"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|x| x.as_u64().unwrap() as u32)
                    .collect();
                assert_eq!(tok.encode_plain(&text).unwrap(), ids, "{what}");
            }
            (Err(e), Some(want)) => {
                assert!(
                    e.to_string().contains(want.as_str().unwrap()),
                    "{what}: {e}"
                );
            }
            (got, want) => panic!("{what}: got {got:?}, transformers {want:?}"),
        }
        checked += 1;
    }
    assert_eq!(checked, 24);
}

#[test]
fn a_folder_without_a_template_is_a_clear_error() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama-gqa");
    let e = ChatTemplate::from_dir(&dir).unwrap_err().to_string();
    assert!(
        e.contains("chat_template.jinja") && e.contains("tokenizer_config.json"),
        "{e}"
    );
    assert!(ChatTemplate::new("{% if %}", "", "").is_err());
}

/// Templates that take tools (`tools_expected.json`): signatures written with `tojson` (and
/// `tojson(indent=4)`) exactly as Python's `json.dumps` writes them, assistant turns with
/// calls, `tool` results, and keyword arguments such as `enable_thinking`.
#[test]
fn tool_templates_render_as_transformers_renders_them() {
    let p = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/chat/tools_expected.json");
    let f: Value = serde_json::from_str(&std::fs::read_to_string(p).unwrap()).unwrap();
    let (bos, eos) = (
        f["bos_token"].as_str().unwrap(),
        f["eos_token"].as_str().unwrap(),
    );
    let tools = f["tools"].as_array().unwrap().clone();
    let mut checked = 0;
    for case in f["cases"].as_array().unwrap() {
        let name = case["template"].as_str().unwrap();
        let t = ChatTemplate::new(f["templates"][name].as_str().unwrap(), bos, eos).unwrap();
        let msgs = messages(&f["conversations"][case["conversation"].as_u64().unwrap() as usize]);
        let options = RenderOptions {
            add_generation_prompt: case["add_generation_prompt"].as_bool().unwrap(),
            tools: case["tools"].as_bool().unwrap().then(|| tools.clone()),
            kwargs: case["kwargs"].as_object().unwrap().clone(),
        };
        let got = t.render_with(&msgs, &options).unwrap();
        assert_eq!(got, case["text"].as_str().unwrap(), "{name}: {case}");
        checked += 1;
    }
    assert_eq!(checked, 20);
}

#[test]
fn keyword_arguments_cannot_replace_the_request() {
    let t = ChatTemplate::new("{{ messages | length }}", "", "").unwrap();
    let mut kwargs = serde_json::Map::new();
    kwargs.insert("messages".into(), Value::Array(Vec::new()));
    let options = RenderOptions {
        kwargs,
        ..RenderOptions::default()
    };
    let e = t
        .render_with(&[ChatMessage::new("user", "hi")], &options)
        .unwrap_err();
    assert!(e.to_string().contains("`messages`"), "{e}");
}
