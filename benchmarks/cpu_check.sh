#!/usr/bin/env bash
# One prepared pass of issue 23's CPU figures on a machine of another kind (an AVX2-only CPU, a Zen 4
# or 5): what the CPU has, the native tests, every packed kernel's decode rate beside a bare DRAM read,
# every kernel against llama.cpp's on the same bytes, and the files beside llama.cpp. Each step has
# its own time cap so one slow step cannot eat the others; the i-quant files take llama.cpp's
# quantizer minutes each to make the first time (IQ2_XS ~13 min on two cores), and are cached in
# /tmp/strata-bench for the runs after.
#
#   bash benchmarks/cpu_check.sh [OUT_DIR]
#
# Run it from the virtual environment the README's test command makes (it has llama-cpp-python).
# Logs and JSON results go to OUT_DIR (default: ./cpu-check). THREADS (default 2), ROUNDS (3) and the
# caps (NATIVE_TESTS_S, RATE_S, VS_S, FILES_S, IQ_FILE_S, in seconds) can be set in the environment.
set -u
out=${1:-${OUT:-cpu-check}}
mkdir -p "$out"
py=${PYTHON:-python}
threads=${THREADS:-2}
rounds=${ROUNDS:-3}
export PYTHONUNBUFFERED=1
. "$(dirname "$0")/check_steps.sh"   # step, jstep
{ lscpu | grep -E "Model name|^CPU\(s\)|L3"
  grep -o -w 'avx2\|fma\|f16c\|avx512[a-z_0-9]*\|gfni\|avx_vnni\|amx_int8' /proc/cpuinfo | sort -u | tr '\n' ' '; echo
  $py -c "from strata import native; print('strata sees: avx2', native.cpu_has_avx2(), '| avx512', native.cpu_has_avx512(),
'| avx-vnni', native.cpu_avx_vnni(), '| 512-bit operations split', native.cpu_has_avx512() and native.cpu_splits_512())"
} 2>&1 | tee "$out/machine.txt"
impls="avx2"
if $py -c "from strata import native; raise SystemExit(not native.cpu_has_avx512())"; then impls="avx2 avx512"; fi
all_types="Q4_0 Q8_0 Q2_K Q3_K Q4_K Q5_K Q6_K IQ4_NL IQ4_XS MXFP4 NVFP4 TQ1_0 TQ2_0 IQ1_S IQ1_M IQ2_XXS IQ2_XS IQ2_S IQ3_XXS IQ3_S"
step native_tests "${NATIVE_TESTS_S:-600}" $py -m pytest -q -n "$threads" tests/native -rfEs
# shellcheck disable=SC2086  # the lists split into arguments on purpose
step qdot_rate "${RATE_S:-1500}" $py benchmarks/qdot_rate.py --types $all_types --impls $impls --threads "$threads"
# shellcheck disable=SC2086
step qdot_vs_ggml "${VS_S:-1800}" $py benchmarks/qdot_vs_ggml.py --types $all_types --threads 1 --tokens 1 64 --alternate "$rounds"
jstep files "${FILES_S:-1800}" $py benchmarks/packed_vs_llama.py --shapes medium,mixtral,deepseek,gpt-oss --threads "$threads" \
    -n 32 --reps 2 --rounds "$rounds" --json
for ftype in IQ4_XS Q2_K IQ3_S TQ1_0 IQ1_S IQ2_XXS IQ3_XXS IQ2_XS; do
    jstep "file_$ftype" "${IQ_FILE_S:-1500}" $py benchmarks/packed_vs_llama.py --shapes "medium@$ftype" --threads "$threads" \
        -n 32 --reps 2 --rounds "$rounds" --json
done
for j in "$out"/files.json "$out"/file_*.json; do   # the files' text reports, from their JSON
    [ -s "$j" ] && $py -c "import json, sys; from benchmarks.packed_vs_llama_report import format_in_ram
print(format_in_ram(json.load(open(sys.argv[1]))))" "$j"
done 2>&1 | tee "$out/files.txt"
echo "== results in $out: machine.txt, *.log, files.txt (from files.json, file_*.json)"
