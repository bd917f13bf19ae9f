#!/usr/bin/env bash
# Builds llama.cpp's llama-server, llama-perplexity and llama-quantize once: the server
# for `cbserve bench --baselines llamacpp` and the sweep, llama-perplexity for the
# llama.cpp row of `cbserve bench accuracy` (bench/peers/llama_perplexity.py), and
# llama-quantize for the GGUF files people download (Q4_K_M, Q8_0...) that the format
# benchmarks requantize from the shipped model. `make bench-peers` runs it
# through `python -m bench.peers.llama_server build`, which passes the pinned version
# (LLAMA_CPP_PYTHON_VERSION, kept in bench/peers/llama_server.py, where the bench looks for
# the binaries) and the cache root. No test needs it.
#
# llama.cpp comes from PyPI: the llama-cpp-python sdist vendors its source, and PyPI is
# the one registry every machine of this project reaches. The pinned version below
# fixes which llama.cpp is measured; the binary is cached outside the repository, one
# folder per version, so that a clone, `make clean` or another checkout reuse it:
#
#   ${CBSERVE_PEERS_CACHE:-~/.cache/cbserve}/llama.cpp/<version>/bin/llama-server
#   ${CBSERVE_PEERS_CACHE:-~/.cache/cbserve}/llama.cpp/<version>/bin/llama-perplexity
#
# -DGGML_NATIVE=ON compiles for this CPU (as a user building it here would), so the
# cache is only good on the machine kind that built it: the binary is re-built when
# it does not run, and when one of the two is missing (a cache from before
# llama-perplexity was added gets it by a rebuild). Only these two targets are built, in
# one cmake build with -j2 (they share libllama, ggml and common): a whole llama.cpp
# build takes far longer and the other tools are not measured.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:?run through python -m bench.peers.llama_server build}"
PYTHON="${PYTHON:-python3}"
CACHE="${CBSERVE_PEERS_CACHE:-$HOME/.cache/cbserve}/llama.cpp/$VERSION"
TARGETS=(llama-server llama-perplexity llama-quantize)
JOBS="${JOBS:-2}"

# Each binary is there, and llama-server runs on this CPU (llama-quantize has no
# --version: it prints its usage and exits 1).
all_built() {
    local target
    for target in "${TARGETS[@]}"; do
        [ -x "$CACHE/bin/$target" ] || return 1
    done
    "$CACHE/bin/llama-server" --version >/dev/null 2>&1
}

if all_built; then
    echo "llama.cpp $VERSION (${TARGETS[*]}) is built: $CACHE/bin"
    exit 0
fi

for tool in cmake c++; do
    command -v "$tool" >/dev/null || {
        echo "bench-peers: $tool is needed to build llama.cpp (apt-get install cmake g++)" >&2
        exit 1
    }
done

WORK="$(mktemp -d "${TMPDIR:-/tmp}/llama-cpp-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

echo "downloading the llama-cpp-python $VERSION sdist (it vendors llama.cpp's source) ..."
"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" --dest "$WORK"
tar -xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
SOURCE="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"

GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
# Offline and minimal: no web UI download, no HTTPS (loopback only), no tests or
# examples; static libraries so that each cached file is a whole program. Both targets
# live under tools/, which LLAMA_BUILD_TOOLS (ON by default in a top-level build) adds;
# it is said here because neither target exists without it.
cmake -S "$SOURCE" -B "$WORK/build" "${GENERATOR[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_TOOLS=ON \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF
echo "building ${TARGETS[*]} with -j$JOBS (about 15 minutes on 2 cores) ..."
cmake --build "$WORK/build" --target "${TARGETS[@]}" -j "$JOBS"

mkdir -p "$CACHE/bin"
for target in "${TARGETS[@]}"; do
    cp "$WORK/build/bin/$target" "$CACHE/bin/$target.partial"
    mv "$CACHE/bin/$target.partial" "$CACHE/bin/$target"  # never a half-copied binary
done
"$CACHE/bin/llama-server" --version
echo "llama.cpp $VERSION built: $CACHE/bin (${TARGETS[*]})"
