//! The model's vocabulary as llguidance sees it: every token id as the bytes it stands for,
//! in a [`toktrie::TokTrie`], with the tokenizer itself for the few strings the parser must
//! tokenize.
//!
//! Token strings in `tokenizer.json` are not the token's bytes. Byte-level BPE (GPT-2,
//! Llama 3, Qwen) spells each byte as one printable character (GPT-2's `bytes_to_unicode`
//! table: printable Latin-1 bytes stand for themselves, the other 68 are shifted to U+0100
//! and up); SentencePiece vocabularies (Llama 2, Gemma) write a space as `▁` and bytes
//! without a token of their own as `<0xNN>`. Which spelling a vocabulary uses is read from
//! the vocabulary itself: byte-level when every ordinary token string is made of the 256
//! table characters only. Special tokens (`<|im_end|>`, `</s>`) are written as
//! llguidance's special-token marker byte `0xFF` followed by their text, so no grammar can
//! spell them out of ordinary text; ids the logits have but the tokenizer lacks (padding of
//! the embedding) get no bytes, which the trie never allows.

use crate::tokenizer::Tokenizer;
use std::collections::HashMap;
use std::sync::Arc;
use toktrie::{TokEnv, TokRxInfo, TokTrie, TokenId, TokenizerEnv};

/// GPT-2's byte-to-character table, inverted: the byte each of the 256 characters spells.
fn byte_level_chars() -> HashMap<char, u8> {
    let mut map = HashMap::with_capacity(256);
    let mut shifted = 0u32;
    for b in 0..=255u8 {
        let printable = matches!(b, b'!'..=b'~' | 0xA1..=0xAC | 0xAE..=0xFF);
        let c = if printable {
            char::from(b)
        } else {
            shifted += 1;
            char::from_u32(255 + shifted).unwrap_or(char::REPLACEMENT_CHARACTER)
        };
        map.insert(c, b);
    }
    map
}

/// The bytes of a byte-level token string; `None` if a character is not in the table.
fn byte_level_bytes(piece: &str, table: &HashMap<char, u8>) -> Option<Vec<u8>> {
    piece.chars().map(|c| table.get(&c).copied()).collect()
}

/// The bytes of a SentencePiece token string: `<0xNN>` is that byte, `▁` is a space.
fn sentencepiece_bytes(piece: &str) -> Vec<u8> {
    let hex = piece
        .strip_prefix("<0x")
        .and_then(|h| h.strip_suffix('>'))
        .filter(|h| h.len() == 2);
    match hex.and_then(|h| u8::from_str_radix(h, 16).ok()) {
        Some(b) => vec![b],
        None => piece.replace('\u{2581}', " ").into_bytes(),
    }
}

/// Every id below `vocab_size` as the bytes it stands for (see the module docs).
pub fn token_bytes(tokenizer: &Tokenizer, vocab_size: usize) -> Vec<Vec<u8>> {
    let inner = tokenizer.inner();
    let added = inner.get_added_tokens_decoder();
    let pieces: Vec<Option<String>> = (0..vocab_size as u32)
        .map(|id| match added.contains_key(&id) {
            true => None,
            false => tokenizer.id_to_token(id),
        })
        .collect();
    let table = byte_level_chars();
    let byte_level = pieces
        .iter()
        .flatten()
        .all(|p| byte_level_bytes(p, &table).is_some());
    let mut words: Vec<Vec<u8>> = pieces
        .iter()
        .map(|p| match (p, byte_level) {
            (None, _) => Vec::new(),
            (Some(p), true) => byte_level_bytes(p, &table).unwrap_or_default(),
            (Some(p), false) => sentencepiece_bytes(p),
        })
        .collect();
    for (&id, tok) in &added {
        let Some(w) = words.get_mut(id as usize) else {
            continue;
        };
        *w = match tok.special {
            true => [&[TokTrie::SPECIAL_TOKEN_MARKER], tok.content.as_bytes()].concat(),
            false => tok.content.clone().into_bytes(),
        };
    }
    words
}

/// llguidance's view of the tokenizer: the trie of token bytes and, for the strings a
/// grammar forces, the tokenizer's own encoding.
struct Vocab {
    trie: TokTrie,
    tokenizer: Arc<Tokenizer>,
}

impl TokenizerEnv for Vocab {
    fn tok_trie(&self) -> &TokTrie {
        &self.trie
    }

    fn tokenize_bytes(&self, s: &[u8]) -> Vec<TokenId> {
        // Text that is not UTF-8 goes through the trie's greedy split; a tokenizer error
        // (never seen for plain text) falls back to the same.
        self.trie.tokenize_with_greedy_fallback(s, |text| {
            self.tokenizer
                .encode_plain(text)
                .unwrap_or_else(|_| self.trie.greedy_tokenize(text.as_bytes()))
        })
    }
}

/// The token environment of a model whose logits rows have `vocab_size` entries; its EOS
/// set is the tokenizer's end-of-sequence ids.
pub fn token_env(tokenizer: Arc<Tokenizer>, vocab_size: usize) -> TokEnv {
    let words = token_bytes(&tokenizer, vocab_size);
    let eos: Vec<u32> = tokenizer
        .eos_token_ids()
        .iter()
        .copied()
        .filter(|&t| (t as usize) < vocab_size)
        .collect();
    let info = TokRxInfo {
        vocab_size: vocab_size as u32,
        tok_eos: eos.first().copied().unwrap_or(toktrie::INVALID_TOKEN),
        tok_bos: tokenizer.bos_token_id(),
        tok_pad: None,
        tok_unk: None,
        tok_end_of_turn: None,
    };
    let mut trie = TokTrie::from(&info, &words);
    if eos.len() > 1 {
        trie = trie.with_eos_tokens(&eos);
    }
    Arc::new(Vocab { trie, tokenizer })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_level_table_covers_every_byte_once() {
        let t = byte_level_chars();
        assert_eq!(t.len(), 256);
        let mut bytes: Vec<u8> = t.values().copied().collect();
        bytes.sort_unstable();
        bytes.dedup();
        assert_eq!(bytes.len(), 256);
        // GPT-2's spellings, by hand: space is U+0120 'Ġ', newline U+010A 'Ċ', 'a' itself.
        assert_eq!(t[&'\u{120}'], b' ');
        assert_eq!(t[&'\u{10A}'], b'\n');
        assert_eq!(t[&'a'], b'a');
        assert_eq!(t[&'\u{A1}'], 0xA1);
        assert_eq!(t[&'\u{143}'], 0xAD);
    }

    #[test]
    fn sentencepiece_pieces_become_their_bytes() {
        assert_eq!(sentencepiece_bytes("\u{2581}the"), b" the");
        assert_eq!(sentencepiece_bytes("<0x0A>"), b"\n");
        assert_eq!(sentencepiece_bytes("<0xE2>"), vec![0xE2]);
        assert_eq!(sentencepiece_bytes("<0xZZ>"), b"<0xZZ>");
        assert_eq!(sentencepiece_bytes("<0x0A0>"), b"<0x0A0>");
    }
}
