#!/usr/bin/env bash
# Builds pagellm's C library (release) and installs it under PREFIX (default /usr/local):
# include/pagellm.h, lib/libpagellm_capi.so and .a, and lib/pkgconfig/pagellm.pc, so that
# `cc app.c $(pkg-config --cflags --libs pagellm)` finds it (with PKG_CONFIG_PATH set to
# PREFIX/lib/pkgconfig for a prefix pkg-config does not search). PAGELLM_CAPI_PROFILE picks
# another cargo profile (CI installs the dev one).
set -euo pipefail
prefix="$(realpath -m "${1:-/usr/local}")"
profile="${PAGELLM_CAPI_PROFILE:-release}"
cd "$(dirname "$0")/.."
cargo build --profile "$profile" --locked -p pagellm-capi
out="target/$([ "$profile" = dev ] && echo debug || echo "$profile")"
version="$(sed -n 's/^version = "\(.*\)"/\1/p' capi/Cargo.toml | head -1)"
install -Dm644 capi/include/pagellm.h "$prefix/include/pagellm.h"
install -Dm755 "$out/libpagellm_capi.so" "$prefix/lib/libpagellm_capi.so"
install -Dm644 "$out/libpagellm_capi.a" "$prefix/lib/libpagellm_capi.a"
mkdir -p "$prefix/lib/pkgconfig"
sed -e "s|@PREFIX@|$prefix|" -e "s|@VERSION@|$version|" capi/pagellm.pc.in \
  > "$prefix/lib/pkgconfig/pagellm.pc"
echo "installed pagellm's C library in $prefix"
