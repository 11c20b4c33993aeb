//! Constrained decoding without a GPU (`pagellm::internals::constrain`):
//!
//! - the token bytes the masks are computed over spell every text exactly as the
//!   `tokenizers` crate decodes its tokens, for the shipped byte-level BPE vocabulary and a
//!   SentencePiece one (with `<0xNN>` byte pieces);
//! - random walks through each kind of constraint (a uniformly random allowed token each
//!   step, many seeds, no model; each step's masked logits row agrees token by token with
//!   `Constraint::allows`) end in outputs that an independent checker accepts: the
//!   `jsonschema` crate for schemas and JSON objects, the `regex` crate for regexes, string
//!   comparison for choices, and a hand-written recognizer for a Lark grammar;
//! - invalid schemas, regexes and grammars are errors naming the problem.

use pagellm::internals::constrain::{token_bytes, Compiler, Constraint, StructuredOutput};
use pagellm::internals::tokenizer::Tokenizer;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde_json::{json, Value};
use std::path::Path;
use std::sync::Arc;

fn shipped() -> Arc<Tokenizer> {
    Arc::new(Tokenizer::from_dir(Path::new("models/fortunes-llama")).unwrap())
}

fn spm() -> Tokenizer {
    let file = pagellm::internals::gguf::file::GgufFile::open(Path::new(
        "tests/fixtures/gguf/spm-tokenizer.gguf",
    ))
    .unwrap();
    pagellm::internals::gguf::tokenizer::tokenizer(&file).unwrap()
}

const TEXTS: [&str; 6] = [
    "Hello world",
    "{\"name\": \"Ada\", \"age\": 36}",
    "line one\nline two\n\n\ttabbed",
    "unicode: café, naïve, 日本語, 🦀",
    "numbers 1 12 123 and 3.14159",
    "  leading and trailing  ",
];

#[test]
fn token_bytes_spell_what_the_tokenizer_decodes() {
    let (a, b) = (shipped(), spm());
    for (name, tok) in [("shipped", &*a), ("spm", &b)] {
        let words = token_bytes(tok, tok.vocab_size());
        assert_eq!(words.len(), tok.vocab_size());
        for text in TEXTS {
            let ids = tok.encode_plain(text).unwrap();
            let bytes: Vec<u8> = ids
                .iter()
                .flat_map(|&i| words[i as usize].clone())
                .collect();
            let spelled = String::from_utf8(bytes).unwrap();
            let decoded = tok.decode(&ids, false).unwrap();
            // SentencePiece's decoder drops the space its pre-tokenizer put before the first
            // word; the token itself does spell it.
            let spelled = match name {
                "spm" => spelled.strip_prefix(' ').unwrap_or(&spelled).to_string(),
                _ => spelled,
            };
            assert_eq!(spelled, decoded, "{name}: {text:?}");
        }
    }
}

/// A uniformly random walk through `c`: each step one of the allowed tokens, until an
/// end-of-sequence id is drawn, the constraint is complete, or `max` tokens. Returns the
/// text and whether it ended (false: cut off at `max`).
fn walk(c: &mut Constraint, tok: &Tokenizer, rng: &mut ChaCha8Rng, max: usize) -> (String, bool) {
    let mut ids = Vec::new();
    let mut row = vec![0.0f32; tok.vocab_size()];
    for _ in 0..max {
        row.iter_mut().enumerate().for_each(|(i, x)| *x = i as f32);
        c.apply(&mut row).unwrap();
        let allowed: Vec<u32> = (0..row.len() as u32)
            .filter(|&i| row[i as usize].is_finite())
            .collect();
        // `apply` masks exactly the tokens `allows` refuses, and leaves the others alone.
        for (i, &x) in row.iter().enumerate() {
            assert_eq!(x.is_finite(), c.allows(i as u32).unwrap(), "token {i}");
            assert!(!x.is_finite() || x == i as f32, "token {i} changed to {x}");
        }
        assert!(
            !allowed.is_empty(),
            "an empty mask after {:?}",
            tok.decode(&ids, true)
        );
        let t = allowed[rng.random_range(0..allowed.len())];
        if tok.is_eos(t) {
            return (tok.decode(&ids, true).unwrap(), true);
        }
        c.accept(t).unwrap();
        ids.push(t);
        if c.is_finished() {
            return (tok.decode(&ids, true).unwrap(), true);
        }
    }
    (tok.decode(&ids, true).unwrap(), false)
}

/// Random walks of `seeds` seeds through `spec`; every one must end within `max` tokens,
/// and `check` must accept its text.
fn walks(spec: StructuredOutput, seeds: u64, max: usize, check: impl Fn(&str) -> bool) {
    let tok = shipped();
    let compiler = Compiler::new(tok.clone(), tok.vocab_size()).unwrap();
    let compiled = compiler.compile(&spec).unwrap();
    for seed in 0..seeds {
        let mut rng = ChaCha8Rng::seed_from_u64(seed);
        let mut c = compiled.clone();
        let (text, ended) = walk(&mut c, &tok, &mut rng, max);
        assert!(
            ended,
            "{} seed {seed}: not complete after {max} tokens: {text:?}",
            spec.kind()
        );
        assert!(check(&text), "{} seed {seed}: {text:?}", spec.kind());
    }
}

fn person_schema() -> Value {
    json!({
        "type": "object",
        "properties": {
            "name": {"type": "string", "minLength": 1, "maxLength": 10},
            "age": {"type": "integer", "minimum": 0, "maximum": 150},
            "score": {"type": "number", "minimum": -1, "maximum": 1},
            "tags": {"type": "array", "items": {"enum": ["red", "green", "blue"]}, "maxItems": 3},
            "pet": {"anyOf": [{"type": "null"}, {"type": "object", "properties": {
                "kind": {"const": "cat"}, "lives": {"type": "integer", "maximum": 9}},
                "required": ["kind"], "additionalProperties": false}]}
        },
        "required": ["name", "age", "tags"],
        "additionalProperties": false
    })
}

fn validates(schema: &Value) -> impl Fn(&str) -> bool {
    let validator = jsonschema::validator_for(schema).unwrap();
    move |text| match serde_json::from_str::<Value>(text) {
        Ok(v) => validator.is_valid(&v),
        Err(_) => false,
    }
}

#[test]
fn random_walks_through_a_schema_are_valid_json_for_it() {
    let schema = person_schema();
    walks(
        StructuredOutput::JsonSchema(schema.clone()),
        200,
        400,
        validates(&schema),
    );
}

#[test]
fn random_walks_through_json_object_are_objects() {
    // Any object is unbounded; keep the walks short by biasing nothing and allowing cut-offs
    // to be rare: most random walks close an object quickly once `}` is allowed.
    let tok = shipped();
    let compiler = Compiler::new(tok.clone(), tok.vocab_size()).unwrap();
    let compiled = compiler.compile(&StructuredOutput::JsonObject).unwrap();
    let mut complete = 0;
    for seed in 0..100 {
        let mut c = compiled.clone();
        let (text, ended) = walk(&mut c, &tok, &mut ChaCha8Rng::seed_from_u64(seed), 300);
        if ended {
            complete += 1;
            match serde_json::from_str::<Value>(&text) {
                Ok(v) => assert!(v.is_object(), "{text:?}"),
                // JSON puts no bound on a number's exponent, f64 does: `1E999999` is
                // valid JSON that serde_json will not hold. Anything else is a failure.
                Err(e) => {
                    assert!(
                        e.to_string().contains("number out of range"),
                        "{text:?}: {e}"
                    );
                    assert!(text.starts_with('{') && text.ends_with('}'), "{text:?}");
                }
            }
        } else {
            // A cut-off walk is still a prefix of some object: it opens with `{`.
            assert!(text.starts_with('{'), "{text:?}");
        }
    }
    assert!(
        complete >= 20,
        "only {complete} of 100 walks closed their object"
    );
}

#[test]
fn random_walks_through_a_regex_match_it() {
    let rx = r"[0-9]{3}-[a-z]{2,5}( #[0-9a-f]{1,4})?";
    let full = regex::Regex::new(&format!("^(?:{rx})$")).unwrap();
    walks(StructuredOutput::Regex(rx.into()), 200, 60, |t| {
        full.is_match(t)
    });
}

#[test]
fn random_walks_through_a_choice_pick_one_of_them() {
    let options = vec![
        "positive".to_string(),
        "negative".to_string(),
        "neutral \"ish\"".to_string(),
        "日本".to_string(),
    ];
    let o = options.clone();
    walks(StructuredOutput::Choice(options), 200, 40, move |t| {
        o.iter().any(|x| x == t)
    });
}

/// Recognizes `list := "[" item ("," item)* "]"`, `item := NUMBER | list`, `NUMBER :=
/// [0-9]{1,3}`: nested lists of small numbers, written by hand.
fn nested_list(s: &[u8]) -> Option<&[u8]> {
    let mut rest = s.strip_prefix(b"[")?;
    loop {
        rest = if rest.first() == Some(&b'[') {
            nested_list(rest)?
        } else {
            let digits = rest.iter().take_while(|b| b.is_ascii_digit()).count();
            if !(1..=3).contains(&digits) {
                return None;
            }
            &rest[digits..]
        };
        match rest.first() {
            Some(b',') => rest = &rest[1..],
            Some(b']') => return Some(&rest[1..]),
            _ => return None,
        }
    }
}

#[test]
fn random_walks_through_a_lark_grammar_derive_from_it() {
    let grammar = r#"
start: list
list: "[" item ("," item)* "]"
item: NUMBER | list
NUMBER: /[0-9]{1,3}/
"#;
    let mut complete = 0;
    let tok = shipped();
    let compiler = Compiler::new(tok.clone(), tok.vocab_size()).unwrap();
    let compiled = compiler
        .compile(&StructuredOutput::Grammar(grammar.into()))
        .unwrap();
    for seed in 0..200 {
        let mut c = compiled.clone();
        let (text, ended) = walk(&mut c, &tok, &mut ChaCha8Rng::seed_from_u64(seed), 200);
        if ended {
            complete += 1;
            assert_eq!(
                nested_list(text.as_bytes()),
                Some(&b""[..]),
                "seed {seed}: {text:?}"
            );
        }
    }
    assert!(
        complete >= 100,
        "only {complete} of 200 walks closed their list"
    );
}

#[test]
fn a_fork_continues_on_its_own() {
    // Cloned at the same point, two constraints advance independently: one completes a
    // choice, the other can still take the rest of the longer one.
    let tok = shipped();
    let compiler = Compiler::new(tok.clone(), tok.vocab_size()).unwrap();
    let spec = StructuredOutput::Choice(vec!["ab".into(), "abab".into()]);
    let mut a = compiler.compile(&spec).unwrap();
    let ids = tok.encode_plain("ab").unwrap();
    for &t in &ids {
        assert!(a.allows(t).unwrap());
        a.accept(t).unwrap();
    }
    let mut b = a.clone();
    assert!(!a.is_finished(), "\"ab\" may still grow into \"abab\"");
    for &t in &ids {
        b.accept(t).unwrap();
    }
    assert!(b.is_finished());
    assert!(!a.is_finished());
    // `a` may end now (an end-of-sequence id is allowed) or continue.
    let eos = tok.eos_token_ids()[0];
    assert!(a.allows(eos).unwrap());
    assert!(a.allows(ids[0]).unwrap());
}

#[test]
fn invalid_constraints_are_errors_naming_the_problem() {
    let tok = shipped();
    let compiler = Compiler::new(tok.clone(), tok.vocab_size()).unwrap();
    let cases = [
        (
            StructuredOutput::Regex("(unclosed".into()),
            "unclosed group",
        ),
        (
            StructuredOutput::JsonSchema(json!({"type": "integer", "minimum": 5, "maximum": 1})),
            "json_schema",
        ),
        (
            StructuredOutput::JsonSchema(json!(false)),
            "no value matches",
        ),
        (
            StructuredOutput::JsonSchema(json!({"type": "nonsense"})),
            "nonsense",
        ),
        (
            StructuredOutput::Grammar("start: missing_rule".into()),
            "missing_rule",
        ),
        (StructuredOutput::Grammar("   ".into()), "empty"),
        (StructuredOutput::Choice(vec![]), "empty"),
    ];
    for (spec, needle) in cases {
        let e = compiler
            .compile(&spec)
            .err()
            .unwrap_or_else(|| panic!("{spec:?} compiled"));
        let msg = e.to_string();
        assert!(msg.contains(spec.kind()), "{msg}");
        assert!(msg.contains(needle), "{spec:?}: {msg}");
    }
}
