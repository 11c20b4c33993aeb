#!/usr/bin/env bash
# The Python package, as a user installs it: a fresh virtual environment installs it from
# the repository with pip (maturin, from PyPI, builds it) and runs its tests on the shipped
# model, comparing with the `pagellm` binary the workspace's tests built.
#
# A user's `pip install ./python` builds the release profile; here cargo's dev profile
# (MATURIN_PEP517_ARGS), whose dependencies the test build has already compiled, keeps
# CI minutes down. The outputs are the same: the tests compare tokens and logprobs with
# the release-independent references (transformers' tokens, the CLI's JSON).
set -euo pipefail
cd "$(dirname "$0")/.."
venv="$(mktemp -d)/venv"
python3 -m venv "$venv"
"$venv/bin/pip" install -q --disable-pip-version-check "pytest>=7"
MATURIN_PEP517_ARGS="--profile dev --locked" \
  "$venv/bin/pip" install -q --disable-pip-version-check ./python
# Run from outside the source tree, so that the installed package is what is imported.
cd python/tests
PAGELLM_REQUIRE_CLI=1 PAGELLM_CLI="$(cd ../.. && pwd)/target/debug/pagellm" \
  "$venv/bin/python" -m pytest -q -p no:cacheprovider .
echo "the Python package installs from the repository and passes its tests"
