"""Importance matrices flow both ways with llama.cpp's own tools, where they are built
($STRATA_LLAMA_CPP_BIN, or /tmp/llbuild/bin: `cmake -B /tmp/llbuild -DLLAMA_CURL=OFF` in
llama.cpp's source, then `cmake --build /tmp/llbuild --target llama-imatrix llama-quantize`):
`llama-imatrix`'s file (GGUF and legacy) drives `--imatrix` and agrees with Strata's on the same
model and text; `llama-quantize --imatrix` accepts the file `strata imatrix` writes."""
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from converters import TypePolicy, convert
from converters.calib.imatrix import read_imatrix
from strata.synth.tokenizer import corpus
from tests.fixtures.tiny import zoo

pytestmark = pytest.mark.interop


def _tool(name: str) -> Path:
    for folder in (os.environ.get("STRATA_LLAMA_CPP_BIN", ""), "/tmp/llbuild/bin"):
        if folder and (Path(folder) / name).is_file():
            return Path(folder) / name
    pytest.skip(f"{name} is not built (set STRATA_LLAMA_CPP_BIN)")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    root = tmp_path_factory.mktemp("llimatrix")
    text = root / "calib.txt"
    text.write_text(" ".join(corpus(600, seed=1)))
    tiny = zoo().get("mixtral")
    return root, text, tiny


def _run(args):
    p = subprocess.run([str(a) for a in args], capture_output=True, text=True, timeout=600)
    assert p.returncode == 0, p.stdout[-2000:] + p.stderr[-2000:]
    return p.stdout + p.stderr


@pytest.mark.parametrize("fmt", ["gguf", "dat"])
def test_llama_imatrix_file_drives_convert(setup, fmt):
    root, text, tiny = setup
    out = root / f"llama.imatrix.{fmt}"
    _run([_tool("llama-imatrix"), "-m", tiny.gguf("f32"), "-f", text, "-o", out, "-c", "128", "--chunks", "4",
          "--output-format", fmt, "--no-ppl", "-t", "2"])
    ours = root / "strata.imatrix"
    _run([sys.executable, "-m", "strata", "imatrix", tiny.gguf("f32"), "-f", text, "-o", ours, "--ctx", "128",
          "--chunks", "4", "--no-progress"])
    theirs, mine = read_imatrix(out), read_imatrix(ours)
    for name, shape in (("blk.0.attn_q.weight", (256, 256)), ("blk.1.ffn_down_exps.weight", (4, 256, 256))):
        a, b = theirs.importance(name, shape), mine.importance(name, shape)
        assert a is not None and b is not None, name
        # the same activations up to BOS handling and llama.cpp's float path
        assert np.corrcoef(a.ravel(), b.ravel())[0, 1] > 0.98, name
    convert(tiny.hf_dir, root / f"q-{fmt}.gguf", TypePolicy(), n_threads=2, imatrix=out)
    assert (root / f"q-{fmt}.gguf").stat().st_size > 0


def test_llama_quantize_reads_strata_imatrix(setup):
    root, text, tiny = setup
    ours = root / "strata-q.imatrix"
    _run([sys.executable, "-m", "strata", "imatrix", tiny.gguf("f32"), "-f", text, "-o", ours, "--ctx", "128",
          "--chunks", "4", "--no-progress"])
    log = _run([_tool("llama-quantize"), "--imatrix", ours, tiny.gguf("f32"), root / "llq.gguf", "Q4_K_M", "2"])
    assert "loaded 14 importance matrix entries" in log, log[-1500:]
