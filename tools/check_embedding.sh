#!/usr/bin/env bash
# The embedding check (CI runs it): a new crate outside the repository depends on pagellm
# by path with default features; it must build none of the server or command-line stack
# (`cargo tree`), and the embedding example (examples/embed.rs, the one in README.md) run in
# it must stream exactly the text `pagellm generate` writes for the same greedy request.
set -euo pipefail
repo="$(cd "$(dirname "$0")/.." && pwd)"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
crate="$work/embed-check"
mkdir -p "$crate/src"
cp "$repo/examples/embed.rs" "$crate/src/main.rs"
# The repository's lock file and build profiles, so the same versions are built and the
# dependencies the repository has already compiled are reused.
cp "$repo/Cargo.lock" "$crate/Cargo.lock"
cat > "$crate/Cargo.toml" <<TOML
[package]
name = "embed-check"
version = "0.0.0"
edition = "2021"
publish = false

[dependencies]
pagellm = { path = "$repo" }

[profile.dev]
debug = "line-tables-only"

[profile.dev.package."*"]
opt-level = 2
debug = false
TOML
cd "$crate"
export CARGO_TARGET_DIR="$repo/target"
tree="$(cargo tree -e normal --prefix none)"
grep -q '^pagellm v' <<<"$tree" || { echo "pagellm is not in the tree"; exit 1; }
forbidden='^(tokio|axum|hyper|hyper-util|tower|tower-http|clap|indicatif|prometheus-client|tracing-subscriber) v'
if grep -E "$forbidden" <<<"$tree"; then
  echo "a library user builds the crates above; they belong to the server or the CLI"
  exit 1
fi
model="$repo/models/fortunes-llama"
prompt="A wise man once said"
got="$(cargo run --quiet -- "$model")"
# The binary the tests ran, if they ran here; else built now.
pagellm="$repo/target/debug/pagellm"
[ -x "$pagellm" ] || (cd "$repo" && cargo build --quiet -p pagellm-cli)
want="$("$pagellm" generate --model "$model" --prompt "$prompt" --temperature 0 --max-tokens 24)"
if [ "$prompt$got" != "$want" ]; then
  printf 'the embedding example wrote\n%s\nbut pagellm generate wrote\n%s\n' "$prompt$got" "$want"
  exit 1
fi
crates="$(sed 's/ (\*)$//' <<<"$tree" | sort -u | grep -c .)"
echo "embedding check: $crates crates, none of the server or CLI stack; it streamed: $got"
