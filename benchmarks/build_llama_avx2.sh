#!/usr/bin/env bash
# Build llama-cpp-python 0.3.36 for AVX2 only (AVX-512, AVX-VNNI and AMX off), once, into a folder of
# its own, so that an AVX-512 machine can run llama.cpp's AVX2 kernels beside Strata's
# (STRATA_KERNEL=avx2): both engines on the code an AVX2-only CPU runs, on the same hardware.
#
#   benchmarks/build_llama_avx2.sh [TARGET]      # TARGET defaults to .ci-cache/llama-avx2
#   STRATA_KERNEL=avx2 PYTHONPATH="$(benchmarks/build_llama_avx2.sh)" python benchmarks/qdot_vs_ggml.py ...
#   STRATA_KERNEL=avx2 PYTHONPATH="$(benchmarks/build_llama_avx2.sh)" python benchmarks/packed_vs_llama.py ...
#
# The benchmarks import llama_cpp from PYTHONPATH ahead of the venv's own build; their ISA line
# says which one ran ("AVX2 FMA ..." with no AVX512). It is not an AVX2-only CPU: the cores, caches
# and memory are this machine's. Strata's AVX2 family also takes AVX-VNNI where the CPU has it (this
# Xeon and Intel's AVX2-only client cores do: TQ1_0's decode, native/kernels/avx2/qdot_tq1_avxvnni.c);
# STRATA_KERNEL="avx2 -avxvnni" gives the code a CPU without it runs (Zen 2, Zen 3), as this llama.cpp build is.
# A folder that already holds the package is reused as is. NICE
# (default 10) sets the niceness of the build (10-18 minutes on two cores). Prints TARGET last.
set -euo pipefail
root="$(cd "$(dirname "$0")/.." && pwd)"
target="${1:-$root/.ci-cache/llama-avx2}"
if [ -f "$target/llama_cpp/__init__.py" ]; then echo "$target"; exit 0; fi
mkdir -p "$target"
off="-DGGML_AVX512=OFF -DGGML_AVX512_VBMI=OFF -DGGML_AVX512_VNNI=OFF -DGGML_AVX512_BF16=OFF -DGGML_AVX_VNNI=OFF"
off="$off -DGGML_AMX_TILE=OFF -DGGML_AMX_INT8=OFF -DGGML_AMX_BF16=OFF"
CMAKE_ARGS="-DGGML_NATIVE=OFF -DGGML_AVX=ON -DGGML_AVX2=ON -DGGML_FMA=ON -DGGML_F16C=ON -DGGML_BMI2=ON $off -DLLAMA_CURL=OFF" \
    nice -n "${NICE:-10}" python -m pip install -q --no-cache-dir --no-binary llama-cpp-python --no-deps \
    --target "$target" llama-cpp-python==0.3.36 >&2
echo "$target"
