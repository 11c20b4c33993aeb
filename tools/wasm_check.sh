#!/usr/bin/env bash
# The browser build check (CI runs it): the library must compile for wasm32-unknown-unknown
# without its `native` feature. The rustup toolchain of these machines has no standard
# library for that target, so the check uses Debian's Rust for the web instead: `rustc-web`
# and `cargo-web` (a current compiler, installed as /usr/bin/rustc and /usr/bin/cargo),
# `rust-web-src` (the standard library's source, which cargo builds for the target with
# -Zbuild-std; RUSTC_BOOTSTRAP lets this stable compiler take that flag) and `lld` (the
# wasm linker). Builds go to target/wasm32, apart from the native ones.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
[ -x /usr/bin/cargo ] && /usr/bin/rustc --version 2>/dev/null | grep -q '^rustc 1\.' \
  || need+=(rustc-web cargo-web)
[ -d /usr/lib/rustlib/src/rust/library/std ] || need+=(rust-web-src)
command -v wasm-ld >/dev/null || need+=(lld)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${need[@]}"
fi

# The getrandom cfg of .cargo/config.toml, repeated: RUSTFLAGS replaces that file's flags.
PATH=/usr/bin:$PATH RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
  RUSTFLAGS='--cfg getrandom_backend="wasm_js" -D warnings' \
  CARGO_TARGET_DIR=target/wasm32 \
  CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER=wasm-ld \
  /usr/bin/cargo check --locked -p pagellm --no-default-features \
  --target wasm32-unknown-unknown -Zbuild-std=std,panic_abort
echo "the library compiles for wasm32-unknown-unknown without the native feature"
