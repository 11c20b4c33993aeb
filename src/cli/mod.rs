//! Subcommands of the `pagellm` binary.

pub mod devices;
pub mod generate;
