#!/usr/bin/env bash
# Builds llama.cpp, the reference the rknn-llm crate is tested against, from the source archive
# of PyPI's llama-cpp-python (its vendor/llama.cpp), with cmake and ninja from PyPI.
#
#   scripts/llama-cpp.sh               fetch + build (Release, CPU only, native), print bin dir
#   scripts/llama-cpp.sh --vocab-only  fetch + extract only llama.cpp's test data: tokenizer
#                                      (models/ggml-vocab-*.gguf with .inp/.out) and chat
#                                      templates (models/templates/*.jinja), no build
#   scripts/llama-cpp.sh --print-bin   print the bin dir if built, fail otherwise
#   scripts/llama-cpp.sh --server      the default build, then llama-server into the same bin
#                                      dir (on request only: its sources are a long C++ compile
#                                      on 2 cores); no web UI is fetched or embedded
#
# Everything lands under ${RKNPU_CACHE:-$HOME/.cache/rknpu-rs}/llama.cpp/:
#   bin/      llama-tokenize, llama-completion, llama-cli, llama-bench, llama-perplexity,
#             llama-embedding
#             (+ llama-server with --server)
#   vocab/    ggml-vocab-*.gguf, *.gguf.inp, *.gguf.out
#   templates/  *.jinja (the chat templates of llama.cpp's tests, MIT like llama.cpp)
#   src/      the extracted vendor/llama.cpp, build/ its cmake tree
# Idempotent: a warm cache makes every mode a no-op. Set LLAMA_CPP_SDIST to a local copy of
# llama_cpp_python-0.3.36.tar.gz to skip the download. Nothing here is ever committed.
set -euo pipefail

VERSION=0.3.36
SDIST_NAME="llama_cpp_python-$VERSION.tar.gz"
CACHE="${RKNPU_CACHE:-$HOME/.cache/rknpu-rs}"
ROOT="$CACHE/llama.cpp"
DL="$CACHE/downloads"
JOBS="${LLAMA_CPP_JOBS:-2}"
TARGETS=(llama-tokenize llama-completion llama-cli llama-bench llama-perplexity llama-embedding)

mode=build
case "${1:-}" in
  "") ;;
  --vocab-only) mode=vocab ;;
  --print-bin) mode=print ;;
  --server) mode=server ;;
  -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
  *) echo "llama-cpp.sh: unknown argument '$1' (try --help)" >&2; exit 2 ;;
esac

log() { printf 'llama-cpp.sh: %s\n' "$*" >&2; }

built_stamp="$ROOT/bin/.built-$VERSION"
# llama-embedding (under examples/, hence LLAMA_BUILD_EXAMPLES=ON) came later: a cache built
# before has the stamp but not it, and builds it (ggml and llama are not recompiled).
if [ -f "$built_stamp" ] && [ ! -x "$ROOT/bin/llama-embedding" ]; then rm -f "$built_stamp"; fi
vocab_stamp="$ROOT/vocab/.extracted-$VERSION"
templates_stamp="$ROOT/templates/.extracted-$VERSION"
server_stamp="$ROOT/bin/.built-server-$VERSION"

if [ "$mode" = print ]; then
  if [ -f "$built_stamp" ]; then echo "$ROOT/bin"; exit 0; fi
  log "llama.cpp $VERSION is not built under $ROOT; run scripts/llama-cpp.sh"; exit 1
fi
if [ "$mode" = vocab ] && [ -f "$vocab_stamp" ] && [ -f "$templates_stamp" ]; then
  log "vocab test data already in $ROOT/vocab, chat templates in $ROOT/templates"; echo "$ROOT/vocab"; exit 0
fi
if [ "$mode" = build ] && [ -f "$built_stamp" ]; then
  log "already built"; echo "$ROOT/bin"; exit 0
fi
if [ "$mode" = server ] && [ -f "$built_stamp" ] && [ -f "$server_stamp" ]; then
  log "already built (with llama-server)"; echo "$ROOT/bin"; exit 0
fi

# The source archive: an explicit copy, the cache, or pip. --no-binary names only this package so
# pip's metadata step takes cmake/ninja/scikit-build-core as wheels instead of compiling them.
sdist="${LLAMA_CPP_SDIST:-$DL/$SDIST_NAME}"
if [ ! -f "$sdist" ]; then
  mkdir -p "$DL"
  log "downloading llama-cpp-python==$VERSION source archive into $DL"
  python3 -m pip download --quiet --no-deps --no-binary llama-cpp-python \
    "llama-cpp-python==$VERSION" -d "$DL"
  sdist="$DL/$SDIST_NAME"
  [ -f "$sdist" ] || { log "pip did not produce $sdist"; exit 1; }
fi
prefix="llama_cpp_python-$VERSION/vendor/llama.cpp"

if [ "$mode" = vocab ]; then
  if [ ! -f "$vocab_stamp" ]; then
    tmp="$ROOT/vocab.tmp"
    rm -rf "$tmp"; mkdir -p "$tmp"
    tar -xzf "$sdist" -C "$tmp" --strip-components=4 --wildcards "$prefix/models/ggml-vocab-*"
    n=$(find "$tmp" -name 'ggml-vocab-*.gguf' | wc -l)
    [ "$n" -gt 0 ] || { log "no ggml-vocab-*.gguf in $sdist"; exit 1; }
    touch "$tmp/.extracted-$VERSION"
    rm -rf "$ROOT/vocab"; mv "$tmp" "$ROOT/vocab"
    log "extracted $n vocab files"
  fi
  if [ ! -f "$templates_stamp" ]; then
    tmp="$ROOT/templates.tmp"
    rm -rf "$tmp"; mkdir -p "$tmp"
    tar -xzf "$sdist" -C "$tmp" --strip-components=5 --wildcards "$prefix/models/templates/*.jinja"
    n=$(find "$tmp" -name '*.jinja' | wc -l)
    [ "$n" -gt 0 ] || { log "no models/templates/*.jinja in $sdist"; exit 1; }
    touch "$tmp/.extracted-$VERSION"
    rm -rf "$ROOT/templates"; mv "$tmp" "$ROOT/templates"
    log "extracted $n chat templates"
  fi
  echo "$ROOT/vocab"
  exit 0
fi

# Build tools from PyPI in a private venv, so the system Python stays untouched.
venv="$CACHE/py"
if [ ! -x "$venv/bin/cmake" ] || [ ! -x "$venv/bin/ninja" ]; then
  log "installing cmake and ninja from PyPI into $venv"
  python3 -m venv "$venv"
  "$venv/bin/python" -m pip install --quiet cmake ninja
fi

src="$ROOT/src"
if [ ! -f "$src/CMakeLists.txt" ]; then
  rm -rf "$src.tmp"; mkdir -p "$src.tmp"
  tar -xzf "$sdist" -C "$src.tmp" --strip-components=3 "$prefix"
  rm -rf "$src"; mv "$src.tmp" "$src"
fi
# The vendored tree is a git submodule in the archive: its .git file points nowhere and makes
# llama.cpp's build info step complain.
rm -f "$src/.git"

build="$ROOT/build"
# $1: ON or OFF for the server (and the llama-cli that, in this version, is built on it). The
# other options stay the same in both, so switching reconfigures without recompiling ggml/llama.
configure() {
  "$venv/bin/cmake" -S "$src" -B "$build" -G Ninja \
    -DCMAKE_MAKE_PROGRAM="$venv/bin/ninja" \
    -DCMAKE_BUILD_TYPE=Release \
    -DBUILD_SHARED_LIBS=OFF \
    -DGGML_NATIVE=ON \
    -DGGML_CUDA=OFF -DGGML_VULKAN=OFF -DGGML_METAL=OFF -DGGML_OPENCL=OFF \
    -DLLAMA_CURL=OFF \
    -DLLAMA_BUILD_UI=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_SERVER="$1" \
    -DLLAMA_BUILD_EXAMPLES=ON -DLLAMA_BUILD_TOOLS=ON >/dev/null
}

if [ ! -f "$built_stamp" ]; then
  configure OFF
  # Build only the targets this version defines (llama-completion is recent, llama-cli older).
  have=()
  all_targets=$("$venv/bin/ninja" -C "$build" -t targets all 2>/dev/null | cut -d: -f1)
  for t in "${TARGETS[@]}"; do
    if grep -qx "$t" <<<"$all_targets"; then have+=("$t"); fi
  done
  for t in llama-tokenize llama-bench llama-perplexity; do
    grep -qx "$t" <<<"$all_targets" || { log "target $t missing from this llama.cpp"; exit 1; }
  done
  log "building ${have[*]} with -j$JOBS (several minutes on 2 cores)"
  "$venv/bin/cmake" --build "$build" -j "$JOBS" --target "${have[@]}"

  mkdir -p "$ROOT/bin"
  for t in "${have[@]}"; do cp -f "$build/bin/$t" "$ROOT/bin/$t"; done
  touch "$built_stamp"
  log "binaries: ${have[*]}"
fi

if [ "$mode" = server ] && [ ! -f "$server_stamp" ]; then
  # Neither npm nor a download: the server runs without its embedded web UI.
  configure ON
  "$venv/bin/ninja" -C "$build" -t targets all 2>/dev/null | cut -d: -f1 | grep -qx llama-server \
    || { log "target llama-server missing from this llama.cpp"; exit 1; }
  log "building llama-server with -j$JOBS (a long C++ compile on 2 cores)"
  "$venv/bin/cmake" --build "$build" -j "$JOBS" --target llama-server
  mkdir -p "$ROOT/bin"
  cp -f "$build/bin/llama-server" "$ROOT/bin/llama-server"
  touch "$server_stamp"
  log "binaries: llama-server"
fi
echo "$ROOT/bin"
