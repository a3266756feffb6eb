#!/usr/bin/env bash
# Build llama.cpp's `llama-server` from the source CI unpacks, once, for benchmarks/serve_concurrency.py.
#
#   benchmarks/build_llama_server.sh [LLAMA_CPP_SRC] [BUILD_DIR]
#
# LLAMA_CPP_SRC defaults to $STRATA_LLAMA_CPP_SRC, then to the path .ci/run unpacks it to; BUILD_DIR
# to .ci-cache/llama-server-build. A build folder that already holds the binary is reused as is.
# JOBS (default 2) and NICE (default 10) set the parallelism and niceness of the build.
# Prints the path of the binary on its last line.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
src="${1:-${STRATA_LLAMA_CPP_SRC:-$root/.ci-cache/llama_cpp_python-0.3.36/vendor/llama.cpp}}"
build="${2:-$root/.ci-cache/llama-server-build}"
binary="$build/bin/llama-server"
if [ -x "$binary" ]; then echo "$binary"; exit 0; fi
if [ ! -f "$src/CMakeLists.txt" ]; then
    echo "build_llama_server: no llama.cpp source at $src (set STRATA_LLAMA_CPP_SRC or run .ci/run)" >&2
    exit 1
fi
nice -n "${NICE:-10}" cmake -S "$src" -B "$build" -DCMAKE_BUILD_TYPE=Release -DLLAMA_BUILD_SERVER=ON \
    -DGGML_NATIVE=ON -DLLAMA_CURL=OFF -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF >&2
nice -n "${NICE:-10}" cmake --build "$build" --target llama-server -j "${JOBS:-2}" >&2
echo "$binary"
