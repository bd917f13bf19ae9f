#!/usr/bin/env bash
# Builds llama.cpp's llama-server once, for `cbserve bench --baselines llamacpp` and the
# sweep. `make bench-peers` runs it through `python -m bench.llama_server build`, which
# passes the pinned version (LLAMA_CPP_PYTHON_VERSION, kept in bench/llama_server.py,
# where the bench looks for the binary) and the cache root. No test needs it.
#
# llama.cpp comes from PyPI: the llama-cpp-python sdist vendors its source, and PyPI is
# the one registry every machine of this project reaches. The pinned version below
# fixes which llama.cpp is measured; the binary is cached outside the repository, one
# folder per version, so that a clone, `make clean` or another checkout reuse it:
#
#   ${CBSERVE_PEERS_CACHE:-~/.cache/cbserve}/llama.cpp/<version>/bin/llama-server
#
# -DGGML_NATIVE=ON compiles for this CPU (as a user building it here would), so the
# cache is only good on the machine kind that built it: the binary is re-built when
# it does not run. Only the server target is built, with -j2: a whole llama.cpp build
# takes far longer and the other tools are not measured.
set -euo pipefail

VERSION="${LLAMA_CPP_PYTHON_VERSION:?run through python -m bench.llama_server build}"
PYTHON="${PYTHON:-python3}"
CACHE="${CBSERVE_PEERS_CACHE:-$HOME/.cache/cbserve}/llama.cpp/$VERSION"
BINARY="$CACHE/bin/llama-server"
JOBS="${JOBS:-2}"

if [ -x "$BINARY" ] && "$BINARY" --version >/dev/null 2>&1; then
    echo "llama-server $VERSION is built: $BINARY"
    exit 0
fi

for tool in cmake c++; do
    command -v "$tool" >/dev/null || {
        echo "bench-peers: $tool is needed to build llama-server (apt-get install cmake g++)" >&2
        exit 1
    }
done

WORK="$(mktemp -d "${TMPDIR:-/tmp}/llama-server-build.XXXXXX")"
trap 'rm -rf "$WORK"' EXIT

echo "downloading the llama-cpp-python $VERSION sdist (it vendors llama.cpp's source) ..."
"$PYTHON" -m pip download --quiet --no-deps --no-binary :all: \
    "llama-cpp-python==$VERSION" --dest "$WORK"
tar -xzf "$WORK"/llama_cpp_python-"$VERSION".tar.gz -C "$WORK"
SOURCE="$WORK/llama_cpp_python-$VERSION/vendor/llama.cpp"

GENERATOR=()
command -v ninja >/dev/null && GENERATOR=(-G Ninja)
# Offline and minimal: no web UI download, no HTTPS (loopback only), no tests or
# examples; static libraries so that the one cached file is the whole server.
cmake -S "$SOURCE" -B "$WORK/build" "${GENERATOR[@]}" \
    -DCMAKE_BUILD_TYPE=Release \
    -DGGML_NATIVE=ON \
    -DBUILD_SHARED_LIBS=OFF \
    -DLLAMA_BUILD_TESTS=OFF \
    -DLLAMA_BUILD_EXAMPLES=OFF \
    -DLLAMA_BUILD_SERVER=ON \
    -DLLAMA_BUILD_UI=OFF \
    -DLLAMA_USE_PREBUILT_UI=OFF \
    -DLLAMA_OPENSSL=OFF
echo "building llama-server with -j$JOBS (about 10 minutes on 2 cores) ..."
cmake --build "$WORK/build" --target llama-server -j "$JOBS"

mkdir -p "$CACHE/bin"
cp "$WORK/build/bin/llama-server" "$BINARY.partial"
mv "$BINARY.partial" "$BINARY"  # never a half-copied binary in the cache
"$BINARY" --version
echo "llama-server $VERSION built: $BINARY"
