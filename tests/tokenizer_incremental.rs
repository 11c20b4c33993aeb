//! Streaming detokenization with the fixture's byte-level BPE tokenizer: deltas never split a
//! UTF-8 character, and all deltas plus the final flush add up to the full decode, both on
//! real text and on arbitrary id sequences (property tests).

use pagellm::internals::tokenizer::{IncrementalDecoder, Tokenizer};
use proptest::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

const REPLACEMENT: char = '\u{FFFD}';

fn tok() -> &'static Tokenizer {
    static TOK: OnceLock<Tokenizer> = OnceLock::new();
    TOK.get_or_init(|| {
        Tokenizer::from_dir(&Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/llama-gqa"))
            .unwrap()
    })
}

/// The id of the single-byte token for byte `b`, through GPT-2's byte-to-character map.
fn byte_token(b: u8) -> u32 {
    let printable = |b: u8| (0x21..=0x7e).contains(&b) || (0xa1..=0xac).contains(&b) || b >= 0xae;
    let c = if printable(b) {
        char::from(b)
    } else {
        let rank = (0..b).filter(|&x| !printable(x)).count() as u32;
        char::from_u32(256 + rank).unwrap()
    };
    tok().token_to_id(&c.to_string()).unwrap()
}

/// Feeds `ids` one by one; returns the deltas (flush last) after checking, at every step,
/// that the shown text is a prefix of the decode so far and never ends in U+FFFD.
fn stream(dec: &mut IncrementalDecoder, ids: &[u32], skip: bool) -> Vec<String> {
    let mut deltas = Vec::new();
    let mut shown = String::new();
    for (k, &id) in ids.iter().enumerate() {
        let delta = dec.step(tok(), id).unwrap();
        shown.push_str(&delta);
        deltas.push(delta);
        let so_far = tok().decode(&ids[..=k], skip).unwrap();
        assert!(
            so_far.starts_with(&shown),
            "step {k}: shown {shown:?} is not a prefix of {so_far:?}"
        );
        assert!(
            !shown.ends_with(REPLACEMENT),
            "step {k}: shown text ends with an incomplete character: {shown:?}"
        );
    }
    deltas.push(dec.flush(tok()).unwrap());
    deltas
}

#[test]
fn multibyte_text_streams_whole_characters() {
    let text = "naïve café 日本語 🙂";
    let ids = tok().encode(text).unwrap();
    // The test means something only if some token ends inside a character.
    let split = ids
        .iter()
        .any(|&id| tok().decode(&[id], false).unwrap().contains(REPLACEMENT));
    assert!(split, "no token of {ids:?} splits a character");

    let mut dec = IncrementalDecoder::new(false);
    let deltas = stream(&mut dec, &ids, false);
    for d in &deltas {
        assert!(!d.contains(REPLACEMENT), "delta {d:?}");
    }
    assert_eq!(deltas.concat(), text);
    assert_eq!(deltas.last().unwrap(), "", "nothing left for the flush");
    assert_eq!(dec.pending_tokens(), 0);
}

#[test]
fn single_byte_tokens_join_into_characters() {
    // 🙂 is F0 9F 99 82: four tokens, one character, shown only at the fourth.
    let ids: Vec<u32> = "a🙂".bytes().map(byte_token).collect();
    let mut dec = IncrementalDecoder::new(false);
    let deltas = stream(&mut dec, &ids, false);
    assert_eq!(deltas, ["a", "", "", "", "🙂", ""]);
}

#[test]
fn flush_releases_an_incomplete_character_as_the_full_decode_does() {
    // The first two bytes of 日 (E6 97 A5), then the stream ends.
    let ids = [byte_token(b'x'), byte_token(0xe6), byte_token(0x97)];
    let mut dec = IncrementalDecoder::new(false);
    assert_eq!(dec.step(tok(), ids[0]).unwrap(), "x");
    assert_eq!(dec.step(tok(), ids[1]).unwrap(), "");
    assert_eq!(dec.step(tok(), ids[2]).unwrap(), "");
    assert_eq!(dec.pending_tokens(), 2);
    let tail = dec.flush(tok()).unwrap();
    assert_eq!(format!("x{tail}"), tok().decode(&ids, false).unwrap());
    assert!(tail.contains(REPLACEMENT));
}

#[test]
fn invalid_bytes_followed_by_text_are_shown_once_terminated() {
    // A lone start byte followed by ASCII can never become valid: shown with the ASCII.
    let ids = [byte_token(0xe6), byte_token(b'z')];
    let mut dec = IncrementalDecoder::new(false);
    assert_eq!(dec.step(tok(), ids[0]).unwrap(), "");
    assert_eq!(dec.step(tok(), ids[1]).unwrap(), "\u{FFFD}z");
    assert_eq!(dec.flush(tok()).unwrap(), "");
}

#[test]
fn fixture_prompts_stream_to_their_text() {
    for text in [
        "Hello, world",
        "Once upon a time there was",
        "To be or not to be",
    ] {
        let ids = tok().encode(text).unwrap();
        let mut dec = IncrementalDecoder::new(false);
        let deltas = stream(&mut dec, &ids, false);
        assert_eq!(deltas.concat(), text);
        // Plain ASCII: every token shows at once, leading spaces included.
        assert!(
            deltas[..ids.len()].iter().all(|d| !d.is_empty()),
            "{deltas:?}"
        );
    }
}

#[test]
fn special_tokens_are_skipped_or_shown() {
    let mut ids = tok().encode("Hi").unwrap();
    ids.push(1);
    ids.extend(tok().encode(" there").unwrap());

    let mut dec = IncrementalDecoder::new(true);
    assert_eq!(stream(&mut dec, &ids, true).concat(), "Hi there");
    let mut dec = IncrementalDecoder::new(false);
    assert_eq!(stream(&mut dec, &ids, false).concat(), "Hi</s> there");
}

#[test]
fn prompt_context_is_not_emitted() {
    let prompt = tok().encode("Hello, world").unwrap();
    let generated = tok().encode(" and 日本").unwrap();
    let mut dec = IncrementalDecoder::with_prompt(&prompt, false);
    let mut out = String::new();
    for &id in &generated {
        out.push_str(&dec.step(tok(), id).unwrap());
    }
    out.push_str(&dec.flush(tok()).unwrap());
    assert_eq!(out, " and 日本");
}

/// Concatenated deltas must equal the full decode; `stream` checks the per-step properties.
fn check_round_trip(ids: &[u32], skip: bool) -> Result<(), TestCaseError> {
    let mut dec = IncrementalDecoder::new(skip);
    let deltas = stream(&mut dec, ids, skip);
    let full = tok().decode(ids, skip).unwrap();
    prop_assert_eq!(deltas.concat(), full);
    // Only the flush may show U+FFFD at the very end (an unfinished character).
    let (steps, flush) = deltas.split_at(deltas.len() - 1);
    prop_assert!(!steps.concat().ends_with(REPLACEMENT));
    prop_assert!(flush[0].is_empty() || tok().decode(ids, skip).unwrap().ends_with(&flush[0]));
    Ok(())
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 300, ..ProptestConfig::default() })]

    /// Arbitrary ids over the whole vocabulary, specials included.
    #[test]
    fn random_ids_round_trip(ids in prop::collection::vec(0u32..512, 0..40), skip: bool) {
        check_round_trip(&ids, skip)?;
    }

    /// Mostly single bytes >= 0x80, the tokens that produce partial and broken characters.
    #[test]
    fn random_high_bytes_round_trip(
        bytes in prop::collection::vec(prop_oneof![3 => 0x80u8..=0xff, 1 => 0x20u8..0x7f], 0..40),
    ) {
        let ids: Vec<u32> = bytes.into_iter().map(byte_token).collect();
        check_round_trip(&ids, false)?;
    }

    /// Real text in any script (without U+FFFD of its own): no delta may contain U+FFFD.
    #[test]
    fn random_text_streams_without_replacement_chars(text in "\\PC{0,24}") {
        prop_assume!(!text.contains(REPLACEMENT));
        let ids = tok().encode(&text).unwrap();
        let mut dec = IncrementalDecoder::new(false);
        let deltas = stream(&mut dec, &ids, false);
        for d in &deltas {
            prop_assert!(!d.contains(REPLACEMENT), "delta {:?} of {:?}", d, text);
        }
        prop_assert_eq!(deltas.concat(), text);
    }
}
