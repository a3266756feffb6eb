"""Settings every test shares.

llama.cpp's AMX matrix kernel (llama-cpp-python 0.3.36, built for the machine it runs on) crashes
with a segmentation fault on the tiny models the interop tests build, on Intel CPUs with AMX: in
`ggml_backend_amx_mul_mat`, on files Strata writes and files llama.cpp's own converter writes alike.
Where the CPU has AMX, the tests open llama.cpp models without its extra buffer types (the AMX and
repacked-row copies; `use_extra_bufts`, llama-cli's `--no-repack`), so llama.cpp computes from the
file's own rows, the same arithmetic its other machines use.
"""
from pathlib import Path

import pytest


def _cpu_has_amx() -> bool:
    try:
        flags = Path("/proc/cpuinfo").read_text()
    except OSError:
        return False
    return " amx_int8" in flags or " amx_tile" in flags


@pytest.fixture(scope="session", autouse=True)
def _llama_cpp_without_amx():
    if not _cpu_has_amx():
        yield
        return
    try:
        import llama_cpp.llama_cpp as lib
    except ImportError:  # the interop tests skip themselves
        yield
        return
    default = lib.llama_model_default_params

    def without_extra_buffers():
        params = default()
        params.use_extra_bufts = False
        return params

    lib.llama_model_default_params = without_extra_buffers
    yield
    lib.llama_model_default_params = default
