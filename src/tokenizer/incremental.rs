//! Streaming detokenization: one token id in, the new piece of text out.
//!
//! Decoding each token on its own is wrong in two ways. A byte-level BPE token can end in the
//! middle of a UTF-8 character (`日` is three bytes, often three tokens), and some decoders
//! treat the first token of a text specially (SentencePiece drops the leading space of the
//! first `▁word`). We follow the technique of vLLM's incremental detokenizer and Hugging
//! Face's `TextStreamer`: keep a small window of ids, `window[..read]` being tokens already
//! turned into text and `window[read..]` the tokens not yet shown, and at each step decode
//! both the window and its `..read` part. The new text is what the longer decoding adds to the
//! shorter one. Because both decodings start at the same token, leading-space rules apply
//! equally to both and cancel out.
//!
//! Output is held back while the window's decoding ends in U+FFFD: that is what an incomplete
//! UTF-8 sequence at the end decodes to, and the next token may complete it. Once text is
//! shown, the window drops everything before `read`, so each step decodes only a few tokens.
//! [`IncrementalDecoder::flush`] releases whatever is held at the end of the stream (a
//! genuinely broken byte sequence then shows as U+FFFD, as it does in a full decode).
//!
//! Invariant (tested with the fixture tokenizer, property-based): for a byte-level tokenizer
//! started with [`IncrementalDecoder::new`], the concatenation of all deltas and the final
//! flush equals `tokenizer.decode(all_ids)`.

use super::{Tokenizer, TokenizerError};

/// Replacement character: the decoder's rendering of bytes that are not (yet) valid UTF-8.
const REPLACEMENT: char = '\u{FFFD}';

/// How many prompt tokens [`IncrementalDecoder::with_prompt`] keeps as context, as vLLM does:
/// enough for the decoder to see that the first generated token does not start the text.
const PROMPT_CONTEXT_TOKENS: usize = 5;

/// State of one stream of generated tokens. Holds no reference to the tokenizer, so it can
/// live in a sequence; pass the tokenizer to each call.
#[derive(Clone, Debug, Default)]
pub struct IncrementalDecoder {
    /// Ids from the start of the last shown piece onwards (`prefix_offset` in vLLM's terms).
    window: Vec<u32>,
    /// `window[..read]` has been shown as text; `window[read..]` has not.
    read: usize,
    skip_special_tokens: bool,
}

impl IncrementalDecoder {
    /// A decoder for a stream that starts a new text: the deltas concatenate to
    /// `decode(ids, skip_special_tokens)`.
    pub fn new(skip_special_tokens: bool) -> Self {
        Self {
            window: Vec::new(),
            read: 0,
            skip_special_tokens,
        }
    }

    /// A decoder for a continuation of `prompt_ids`: the last few prompt tokens serve as
    /// context (never emitted), so the first generated word keeps its leading space with
    /// SentencePiece-style decoders, as in vLLM's output text.
    pub fn with_prompt(prompt_ids: &[u32], skip_special_tokens: bool) -> Self {
        let start = prompt_ids.len().saturating_sub(PROMPT_CONTEXT_TOKENS);
        let window = prompt_ids[start..].to_vec();
        Self {
            read: window.len(),
            window,
            skip_special_tokens,
        }
    }

    /// Feeds one generated id; returns the text it makes visible (often empty while a
    /// multi-byte character is incomplete).
    pub fn step(&mut self, tokenizer: &Tokenizer, id: u32) -> Result<String, TokenizerError> {
        self.window.push(id);
        self.advance(tokenizer, false)
    }

    /// Releases the text still held back at the end of the stream (an incomplete character
    /// shows as U+FFFD, exactly as in a full decode).
    pub fn flush(&mut self, tokenizer: &Tokenizer) -> Result<String, TokenizerError> {
        self.advance(tokenizer, true)
    }

    /// Number of ids received but not yet shown as text.
    pub fn pending_tokens(&self) -> usize {
        self.window.len() - self.read
    }

    fn advance(&mut self, tokenizer: &Tokenizer, force: bool) -> Result<String, TokenizerError> {
        if self.read == self.window.len() {
            return Ok(String::new());
        }
        let skip = self.skip_special_tokens;
        let shown = tokenizer.decode(&self.window[..self.read], skip)?;
        let full = tokenizer.decode(&self.window, skip)?;
        if !force && full.ends_with(REPLACEMENT) {
            return Ok(String::new());
        }
        let delta = &full[common_prefix_len(&shown, &full)..];
        // A skipped special token adds no text; keep the window as it is so the next real
        // token is still decoded with its left context.
        if delta.is_empty() && !force {
            return Ok(String::new());
        }
        let delta = delta.to_string();
        self.window.drain(..self.read);
        self.read = self.window.len();
        Ok(delta)
    }
}

/// Byte length of the longest common prefix of `a` and `b` that ends on a character boundary.
///
/// Normally `a` is a prefix of `b`. It is not when the prompt context ends in an incomplete
/// character that the first generated token completes; then the completed character is new
/// text and must be emitted in full.
fn common_prefix_len(a: &str, b: &str) -> usize {
    let mut len = 0;
    for (ca, cb) in a.chars().zip(b.chars()) {
        if ca != cb {
            break;
        }
        len += ca.len_utf8();
    }
    len
}

#[cfg(test)]
mod tests {
    use super::common_prefix_len;

    #[test]
    fn common_prefix_stops_at_the_first_differing_character() {
        assert_eq!(common_prefix_len("abc", "abcdef"), 3);
        assert_eq!(common_prefix_len("", "x"), 0);
        // "é" and "ê" share their first UTF-8 byte; the prefix must not split them.
        assert_eq!(common_prefix_len("aé", "aê"), 1);
        assert_eq!(common_prefix_len("x\u{FFFD}", "x日"), 1);
    }
}
