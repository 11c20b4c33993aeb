#!/usr/bin/env bash
# The C library as a C program's build finds it: installed into a fresh prefix by
# tools/install_capi.sh (in cargo's dev profile here, whose dependencies the tests have
# built; the README's steps use release), the C example is compiled with pkg-config's flags
# against the installed header and library, and streams transformers' greedy tokens for the
# shipped model's first reference prompt.
set -euo pipefail
cd "$(dirname "$0")/.."
work="$(mktemp -d)"
PAGELLM_CAPI_PROFILE=dev bash tools/install_capi.sh "$work/prefix"
export PKG_CONFIG_PATH="$work/prefix/lib/pkgconfig"
# shellcheck disable=SC2046 # pkg-config's flags are words
cc -std=c11 -Wall -Wextra -Werror examples/c/generate.c $(pkg-config --cflags --libs pagellm) \
  -o "$work/generate"
case_field() {
  python3 -c "import json, sys; c = json.load(open('models/fortunes-llama/expected.json'))['cases'][0]; v = c[sys.argv[1]]; print(' '.join(map(str, v)) if isinstance(v, list) else v)" "$1"
}
prompt="$(case_field prompt)"
want="$(case_field greedy_ids)"
got="$(env -u LD_LIBRARY_PATH "$work/generate" models/fortunes-llama "$prompt" 16 2>&1 >/dev/null |
  sed -n 's/^token ids: //p')"
if [ "$got" != "$want" ]; then
  echo "the installed C library streamed [$got], transformers' greedy tokens are [$want]" >&2
  exit 1
fi
rm -rf "$work"
echo "the installed C library streams transformers' greedy tokens"
