//! [`Tokenizer`]: a Hugging Face `tokenizer.json` loaded with the `tokenizers` crate, plus the
//! folder's BOS/EOS ids.
//!
//! Encoding uses the file's own normaliser, pre-tokenizer and post-processor with
//! `add_special_tokens = true`, exactly as `AutoTokenizer(...)(text)` does in transformers: if
//! the post-processor adds a BOS (Llama 2), so do we; if it does not (Llama 3 base, the test
//! fixtures), neither do we. The caller never adds BOS by hand.

use super::special::{read_special_tokens, SpecialTokens};
use super::TokenizerError;
use crate::mapped::Folder;
use std::path::{Path, PathBuf};

/// A loaded tokenizer. Cheap to share behind an `Arc`; every method takes `&self`.
pub struct Tokenizer {
    inner: tokenizers::Tokenizer,
    special: SpecialTokens,
    vocab_size: usize,
    max_bytes_per_token: Option<usize>,
    source: PathBuf,
}

impl std::fmt::Debug for Tokenizer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Tokenizer")
            .field("source", &self.source)
            .field("vocab_size", &self.vocab_size)
            .field("special", &self.special)
            .finish_non_exhaustive()
    }
}

impl Tokenizer {
    /// Loads `dir/tokenizer.json` and the BOS/EOS ids from the folder's config files
    /// (see [`SpecialTokens`] for the order in which they are read).
    pub fn from_dir(dir: &Path) -> Result<Self, TokenizerError> {
        Self::from_folder(Folder::Disk(dir))
    }

    /// [`Self::from_dir`] for a model folder on disk or in memory.
    pub fn from_folder(folder: Folder<'_>) -> Result<Self, TokenizerError> {
        let path = folder.path("tokenizer.json");
        let bytes = match folder.open("tokenizer.json") {
            Ok(bytes) => bytes,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
                return Err(TokenizerError::MissingTokenizerJson {
                    dir: folder.display_path(),
                })
            }
            Err(source) => return Err(TokenizerError::Read { path, source }),
        };
        let inner = tokenizers::Tokenizer::from_bytes(&bytes).map_err(|e| {
            TokenizerError::InvalidTokenizerJson {
                path: path.clone(),
                message: e.to_string(),
            }
        })?;
        let special = read_special_tokens(folder, |token| inner.token_to_id(token))?;
        Ok(Self::assemble(inner, special, path))
    }

    /// Wraps an already built `tokenizers` tokenizer with explicitly given special tokens
    /// (for callers that do not have a model folder).
    pub fn from_parts(inner: tokenizers::Tokenizer, special: SpecialTokens) -> Self {
        Self::assemble(inner, special, PathBuf::new())
    }

    fn assemble(inner: tokenizers::Tokenizer, special: SpecialTokens, source: PathBuf) -> Self {
        // Added tokens may sit above the model's own vocabulary, or fill holes in it, so the
        // size the logits must cover is the largest id in use plus one, not a count.
        let vocab_size = inner
            .get_vocab(true)
            .values()
            .map(|&id| id as usize + 1)
            .max()
            .unwrap_or(0);
        let max_bytes_per_token = bytes_per_token_bound(&inner);
        Self {
            inner,
            special,
            vocab_size,
            max_bytes_per_token,
            source,
        }
    }

    /// An upper bound on the bytes of text one token stands for, where the model gives one
    /// (see `bytes_per_token_bound`): text longer than this times `n` has more than `n`
    /// tokens, which a server can tell without tokenizing it.
    pub fn max_bytes_per_token(&self) -> Option<usize> {
        self.max_bytes_per_token
    }

    /// The beginning-of-sequence id, if the folder declares one.
    pub fn bos_token_id(&self) -> Option<u32> {
        self.special.bos
    }

    /// All end-of-sequence ids the folder declares (possibly none).
    pub fn eos_token_ids(&self) -> &[u32] {
        &self.special.eos
    }

    /// Whether `id` is one of the end-of-sequence ids.
    pub fn is_eos(&self, id: u32) -> bool {
        self.special.eos.contains(&id)
    }

    /// The special tokens as read from the folder.
    pub fn special_tokens(&self) -> &SpecialTokens {
        &self.special
    }

    /// Largest token id (added tokens included) plus one.
    pub fn vocab_size(&self) -> usize {
        self.vocab_size
    }

    /// The `tokenizer.json` this was loaded from (empty for [`Tokenizer::from_parts`]).
    pub fn source(&self) -> &Path {
        &self.source
    }

    /// Token ids of `text`, with the tokenizer's own special-token handling.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode(text, true)
            .map(|enc| enc.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// Token ids of `text` exactly as written, adding no special tokens (for a rendered chat
    /// template, which writes its own BOS).
    pub fn encode_plain(&self, text: &str) -> Result<Vec<u32>, TokenizerError> {
        self.inner
            .encode(text, false)
            .map(|enc| enc.get_ids().to_vec())
            .map_err(|e| TokenizerError::Encode(e.to_string()))
    }

    /// Text of `ids`. Ids outside the vocabulary are skipped (as the `tokenizers` crate does);
    /// bytes that do not form valid UTF-8 come out as U+FFFD.
    pub fn decode(&self, ids: &[u32], skip_special_tokens: bool) -> Result<String, TokenizerError> {
        self.inner
            .decode(ids, skip_special_tokens)
            .map_err(|e| TokenizerError::Decode(e.to_string()))
    }

    /// Id of a token given by its vocabulary string (e.g. `"</s>"`, `"Ġthe"`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.inner.token_to_id(token)
    }

    /// Vocabulary string of an id (not its decoded text: byte-level tokens read `"Ġthe"`).
    pub fn id_to_token(&self, id: u32) -> Option<String> {
        self.inner.id_to_token(id)
    }

    /// The underlying `tokenizers` tokenizer, for anything not wrapped here.
    pub fn inner(&self) -> &tokenizers::Tokenizer {
        &self.inner
    }
}

/// For a BPE model whose unknown characters never fuse into one token (byte-level BPE,
/// byte fallback, or `fuse_unk` off), a token stands for at most its own string's bytes:
/// byte-level strings spell each byte as one or two UTF-8 bytes, SentencePiece's `▁` takes
/// three for one space. Normalisers can shrink text (NFKC maps a three-byte ideographic
/// space to one), so the longest token string is taken four times over. Other models
/// (WordPiece, Unigram, WordLevel) can map a run of unknown text of any length to one
/// token: no bound.
fn bytes_per_token_bound(inner: &tokenizers::Tokenizer) -> Option<usize> {
    let tokenizers::ModelWrapper::BPE(bpe) = inner.get_model() else {
        return None;
    };
    if bpe.fuse_unk && !bpe.byte_fallback && bpe.unk_token.is_some() {
        return None;
    }
    let longest = inner.get_vocab(true).keys().map(String::len).max()?;
    Some(4 * longest.max(4))
}
