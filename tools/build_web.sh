#!/usr/bin/env bash
# Builds the browser package: the engine for wasm32-unknown-unknown (web/), bound to
# JavaScript by wasm-bindgen, with the hand-written API beside it, into web/pkg:
#   pagellm.js, pagellm.d.ts   the API a page imports (Engine, Request)
#   pagellm_web.js, *_bg.wasm  what wasm-bindgen generated
#   package.json               so that a web app or bundler can import the folder
# Usage: tools/build_web.sh [--dev]   (--dev: an unoptimized build, faster to make)
#
# rustup's toolchains on a machine without the wasm32 standard library cannot build this;
# the build uses Debian's Rust for the web instead (installed when missing): rustc-web
# (a current compiler, /usr/bin/rustc and /usr/bin/cargo), rust-web-src (the standard
# library's source, which cargo compiles for the target with -Zbuild-std; RUSTC_BOOTSTRAP
# lets this stable compiler take that flag) and lld (the wasm linker). wasm-bindgen-cli is
# installed from crates.io at the exact version of the wasm-bindgen crate in Cargo.lock.
set -euo pipefail
cd "$(dirname "$0")/.."
profile=release
[ "${1:-}" = "--dev" ] && profile=dev

need=()
/usr/bin/rustc --version 2>/dev/null | grep -qE ' 1\.(9[0-9]|[1-9][0-9]{2})\.' \
  || need+=(rustc-web cargo-web)
[ -d /usr/lib/rustlib/src/rust/library/std ] || need+=(rust-web-src)
command -v wasm-ld >/dev/null || need+=(lld)
if [ ${#need[@]} -gt 0 ]; then
  echo "installing ${need[*]}" >&2
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq >&2
  apt-get install -y -qq --no-install-recommends "${need[@]}" >&2
fi

# The getrandom cfg of .cargo/config.toml applies (no RUSTFLAGS here to replace it).
target=target/wasm
PATH=/usr/bin:$PATH RUSTC=/usr/bin/rustc RUSTC_BOOTSTRAP=1 \
  CARGO_TARGET_DIR=$target \
  CARGO_TARGET_WASM32_UNKNOWN_UNKNOWN_LINKER=wasm-ld \
  /usr/bin/cargo build --locked -p pagellm-web --profile "$profile" \
  --target wasm32-unknown-unknown -Zbuild-std=std,panic_abort
dir=release
[ "$profile" = dev ] && dir=debug

version=$(awk '/^name = "wasm-bindgen"$/ { getline; gsub(/[^0-9.]/, ""); print; exit }' Cargo.lock)
if ! wasm-bindgen --version 2>/dev/null | grep -q " $version$"; then
  echo "installing wasm-bindgen-cli $version" >&2
  # Not --locked: some versions pin a dependency that has left the registry.
  cargo install -q wasm-bindgen-cli --version "$version"
fi
rm -rf web/pkg
wasm-bindgen --target web --out-dir web/pkg "$target/wasm32-unknown-unknown/$dir/pagellm_web.wasm"
cp web/js/pagellm.js web/js/pagellm.d.ts web/pkg/
cat > web/pkg/package.json <<JSON
{
  "name": "pagellm",
  "version": "$(awk -F'"' '/^version = / { print $2; exit }' web/Cargo.toml)",
  "description": "pagellm in the browser: a paged-KV-cache LLM engine on WebGPU",
  "type": "module",
  "main": "pagellm.js",
  "types": "pagellm.d.ts",
  "files": ["pagellm.js", "pagellm.d.ts", "pagellm_web.js", "pagellm_web.d.ts", "pagellm_web_bg.wasm", "pagellm_web_bg.wasm.d.ts"],
  "license": "MIT OR Apache-2.0"
}
JSON
echo "web/pkg: $(du -h web/pkg/pagellm_web_bg.wasm | cut -f1) of wasm ($profile)"
