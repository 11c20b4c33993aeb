//! Subcommands of the `pagellm` binary.

pub mod devices;
pub mod engine_args;
pub mod generate;
pub mod perplexity;
pub mod serve;
