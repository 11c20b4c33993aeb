//! Tokenizer and streaming detokenization (filled in by the engine work).
