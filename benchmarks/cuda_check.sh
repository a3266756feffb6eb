#!/usr/bin/env bash
# One prepared pass on a machine with a CUDA GPU: build the native part, run the `cuda` tests (and
# the native tests, since that machine's CPU is another kind), then the GPU benchmarks of the
# tiered memory. Each step has its own time cap so one slow step cannot eat the others.
#
#   bash benchmarks/cuda_check.sh [OUT_DIR]
#
# Where Python lacks cffi, gguf or llguidance, put their wheels in .whl/ first (see docs/testing.md);
# they are installed into /tmp/site. Logs and JSON results go to OUT_DIR (default: ./cuda-check).
set -u
out=${1:-${OUT:-cuda-check}}
mkdir -p "$out"
py=${PYTHON:-python3}
if compgen -G ".whl/*.whl" >/dev/null; then
    $py -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site .whl/*.whl || exit 1
    export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
fi
export PYTHONUNBUFFERED=1 PYTEST_DISABLE_PLUGIN_AUTOLOAD=1
. "$(dirname "$0")/check_steps.sh"   # step, jstep
{ nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
  lscpu | grep -E "Model name|^CPU\(s\)"
  grep -o 'avx512[a-z_0-9]*\|avx2\|amx_int8' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
  $py -c "import torch, transformers; print('torch', torch.__version__, 'transformers', transformers.__version__)"
} 2>&1 | tee "$out/machine.txt"
step build 240 $py build.py || true
step cuda_tests "${CUDA_TESTS_S:-300}" $py -m pytest -q -m cuda -p xdist.plugin -n "${WORKERS:-6}" --dist loadfile \
    -p pytest_timeout --timeout 240 -rfE tests/engine/test_cuda.py tests/memory tests/quant/test_quant_torch.py \
    tests/quant/test_quant_torch_iquants.py tests/runtime/test_hybrid_cuda.py
step native_tests "${NATIVE_TESTS_S:-120}" $py -m pytest -q -p xdist.plugin -n "${WORKERS:-6}" tests/native -rfE
step tiered_prefetch "${BENCH_S:-90}" $py benchmarks/tiered_prefetch.py --device cuda --json
step tiered_forms "${BENCH_S:-90}" $py benchmarks/tiered_forms.py --device cuda --json
step qdot_rate "${BENCH_S:-90}" $py benchmarks/qdot_rate.py --types Q4_K Q6_K Q8_0 IQ2_XS --impls avx2 avx512 \
    --threads 1 --alternate 2
