//! Text in, token ids out, and back again, for Hugging Face model folders.
//!
//! - [`Tokenizer`] wraps the `tokenizers` crate around a folder's `tokenizer.json` and adds
//!   the BOS/EOS ids that the folder's config files declare ([`SpecialTokens`]).
//! - [`IncrementalDecoder`] turns a stream of generated ids into a stream of text deltas that
//!   never split a UTF-8 character, using the prefix-offset / read-offset window of vLLM's
//!   and Hugging Face `TextStreamer`'s incremental detokenizers.
//! - [`StopChecker`] finds stop strings in the growing output and [`StopStream`] holds back
//!   the tail that could still turn into one, so a client never sees part of a stop string
//!   (vLLM's default: the stop string itself is not part of the output).
//!
//! Nothing here touches the GPU; every function returns a [`TokenizerError`] instead of
//! panicking on a user's files.

mod chat_template;
mod error;
mod hf_tokenizer;
mod incremental;
mod special;
pub(crate) use special::kind as json_kind;
mod stop;

pub use chat_template::{
    ChatMessage, ChatTemplate, ChatTemplateError, RenderOptions, RESERVED_TEMPLATE_NAMES,
};
pub use error::TokenizerError;
pub use hf_tokenizer::Tokenizer;
pub use incremental::IncrementalDecoder;
pub use special::SpecialTokens;
pub use stop::{StopChecker, StopMatch, StopStream, StopUpdate};
