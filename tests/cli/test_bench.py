"""`strata bench dequant`: runs end to end and reports every figure it promises."""
import json
import subprocess
import sys


def test_bench_dequant_json_reports_all_figures():
    out = subprocess.run([sys.executable, "-m", "strata", "bench", "dequant", "--json", "--mib", "1",
                          "--repeat", "1", "--threads", "2", "--types", "q4_k", "q5_0"],
                         capture_output=True, text=True, check=True)
    results = json.loads(out.stdout)
    assert set(results) == {"Q4_K", "Q5_0"}
    from strata import native
    for row in results.values():
        keys = {"scalar_1t", "gguf_quants", "memcpy"}
        if native.cpu_has_avx2():
            keys |= {"avx2_1t", "avx2_2t", "avx2_1t_vs_gguf", "avx2_1t_vs_memcpy"}
        assert keys <= set(row)
        assert all(row[k] > 0 for k in keys)
    if native.cpu_has_avx2():
        assert results["Q4_K"]["avx2_kernel"] == 1.0 and results["Q5_0"]["avx2_kernel"] == 0.0


def test_bench_rejects_unknown_format():
    out = subprocess.run([sys.executable, "-m", "strata", "bench", "dequant", "--types", "q9_z"],
                         capture_output=True, text=True)
    assert out.returncode != 0
    assert "unknown ggml type name 'q9_z'" in out.stderr
    assert "Traceback" not in out.stderr
