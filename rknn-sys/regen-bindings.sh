#!/usr/bin/env bash
# Regenerate src/bindings.rs with bindgen, and diff against the committed file.
#
#   rknn-sys/regen-bindings.sh                      # from our clean-room header (include/)
#   rknn-sys/regen-bindings.sh /path/to/rknpu2/include   # from the vendor SDK's headers
#
# With the vendor headers the script binds `rknn_matmul_api.h` (which includes `rknn_api.h`)
# restricted to the matmul + memory API, so the output must match the committed file up to
# formatting and the two HAND EDITs documented at its top. The vendor headers are never
# committed (their licence forbids redistribution). Needs `bindgen` (cargo install bindgen-cli)
# and libclang; normal builds need neither.
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
if [ $# -ge 1 ]; then
  header="$1/rknn_matmul_api.h"
else
  header="$here/include/rknn_matmul_ffi.h"
fi
[ -f "$header" ] || { echo "no header at $header" >&2; exit 1; }
out=$(mktemp --suffix=.rs)
bindgen "$header" \
  --no-layout-tests --no-doc-comments --use-core=false \
  --default-enum-style consts \
  --with-derive-default --with-derive-partialeq \
  --allowlist-function 'rknn_matmul_.*' \
  --allowlist-function 'rknn_B_normal_layout_to_native_layout' \
  --allowlist-function 'rknn_(create|destroy)_mem.*' \
  --allowlist-function 'rknn_mem_sync' --allowlist-function 'rknn_query' \
  --allowlist-function 'rknn_set_core_mask' --allowlist-function 'rknn_emu_last_error' \
  --allowlist-type 'rknn_.*' --allowlist-var 'RKNN_.*' \
  --output "$out" -- -x c
echo "generated: $out"
# bindgen writes `extern "C" { fn ... }` declarations where the committed file has one
# `*_fn` pointer type per symbol (the loader's table needs the types, not the symbols), so
# compare the types and constants, and check the functions' argument lists by eye.
diff -u <(grep -v '^\s*//' "$here/src/bindings.rs") <(grep -v '^\s*//' "$out") || \
  echo "review the differences above against the fact sheet: names, values, layouts" >&2
