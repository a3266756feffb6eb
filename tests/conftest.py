"""Settings every test shares.

llama.cpp's AMX matrix kernel (llama-cpp-python 0.3.36, built for the machine it runs on) crashes
with a segmentation fault on the tiny models the interop tests build, on Intel CPUs with AMX: in
`ggml_backend_amx_mul_mat`, on files Strata writes and files llama.cpp's own converter writes alike.
Where the CPU has AMX, the tests open llama.cpp models without its extra buffer types (the AMX and
repacked-row copies; `use_extra_bufts`, llama-cli's `--no-repack`), so llama.cpp computes from the
file's own rows, the same arithmetic its other machines use.
"""
import pytest

from benchmarks.llama_amx import cpu_has_amx, open_without_extra_buffers

#: every temporary file of the run in one folder, removed when the run passes (tests/fixtures/temp_root.py)
pytest_plugins = ["tests.fixtures.temp_root"]


@pytest.fixture(scope="session", autouse=True)
def _llama_cpp_without_amx():
    if not cpu_has_amx():
        yield
        return
    try:
        undo = open_without_extra_buffers()
    except ImportError:  # the interop tests skip themselves
        yield
        return
    yield
    undo()
