"""hy_v3 between Strata and llama.cpp: Strata's converter writes the tensors (names, shapes, types)
and metadata llama.cpp's own converter writes, with and without a multi-token-prediction layer;
llama.cpp's MTP file loads in Strata (the layer kept, the trunk's logits transformers'), and
llama.cpp (llama-cpp-python) runs Strata's MTP file with Strata's greedy tokens. (The trunk files
both ways: tests/engine/test_new_archs_llama_cpp.py.)"""
from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest
from gguf import GGUFReader

import strata
from converters import TypePolicy, convert
from tests.fixtures.tiny import LLAMA_CPP_PRE, llama_cpp_source, zoo
from tests.models.helpers import REL_TOL, rel_err
from tests.fixtures.rewrite import rewrite_checkpoint
from tests.models.test_hy_v3 import add_mtp_layer

llama_cpp = pytest.importorskip("llama_cpp")
pytestmark = [pytest.mark.interop,
              pytest.mark.skipif(llama_cpp_source() is None, reason="llama.cpp's source tree not found: set "
                                 "STRATA_LLAMA_CPP_SRC")]

#: Keys that may differ: the header's counts, names, file type and quantization version, tokenizer details.
_OWN = ("GGUF.", "general.", "tokenizer.")


@pytest.fixture(scope="module")
def tiny():
    return zoo().get("hyv3")


@pytest.fixture(scope="module")
def mtp_files(tiny, tmp_path_factory):
    """(Strata's, llama.cpp's) f32 files of the checkpoint with an MTP layer."""
    root = tmp_path_factory.mktemp("hyv3-mtp")
    hf = rewrite_checkpoint(tiny.hf_dir, root / "hf", {"num_nextn_predict_layers": 1}, add_mtp_layer)
    ours, theirs = root / "strata.gguf", root / "llama.cpp.gguf"
    convert(hf, ours, TypePolicy.from_args(outtype="f32"), n_threads=1)
    script = Path(__file__).parents[1] / "fixtures" / "llama_cpp_convert.py"
    subprocess.run([sys.executable, str(script), llama_cpp_source(), LLAMA_CPP_PRE[tiny.spec.tokenizer], str(hf),
                    "--outfile", str(theirs), "--outtype", "f32"], check=True, capture_output=True, text=True)
    return ours, theirs


def _layout(path) -> tuple[dict, dict]:
    reader = GGUFReader(path)
    tensors = {t.name: (t.tensor_type.name, [int(d) for d in t.shape]) for t in reader.tensors}
    fields = {f.name: f.contents() for f in reader.fields.values() if not f.name.startswith(_OWN)}
    return tensors, fields


def _same_layout(ours, theirs) -> None:
    (t_ours, f_ours), (t_theirs, f_theirs) = _layout(ours), _layout(theirs)
    assert t_ours == t_theirs
    assert f_ours.keys() == f_theirs.keys()
    for key, value in f_ours.items():
        assert value == pytest.approx(f_theirs[key]), key


def test_strata_writes_llama_cpps_layout(tiny):
    _same_layout(tiny.gguf("f32"), tiny.llama_cpp_gguf("f32"))


def test_strata_writes_llama_cpps_layout_with_an_mtp_layer(mtp_files):
    _same_layout(*mtp_files)


def test_llama_cpps_mtp_file_in_strata(tiny, mtp_files):
    ids = tiny.prompt_ids(24)
    with strata.load(mtp_files[1], threads=1, n_ctx=64) as m:
        assert [b.index for b in m.transformer.nextn.blocks] == [3] and m.hparams.n_layers == 3
        assert rel_err(m.logits(ids), tiny.hf_logits(ids)) <= REL_TOL


def test_llama_cpp_runs_stratas_mtp_file(tiny, mtp_files):
    llm = llama_cpp.Llama(str(mtp_files[0]), n_ctx=96, verbose=False, n_threads=1)
    prompt = tiny.prompt_ids(16, seed=5)
    greedy = [t for _, t in zip(range(24), llm.generate(prompt, temp=0.0))]
    llm.close()
    with strata.load(mtp_files[0], threads=1, n_ctx=96) as m:
        assert m.generate(prompt, temperature=0, max_tokens=24, stop_token_ids=()).token_ids == greedy


def test_inspect_says_llama_cpps_files_run(tiny, mtp_files, capsys):
    from strata.cli import main
    for path, mtp in ((tiny.llama_cpp_gguf("f32"), False), (mtp_files[1], True)):
        assert main(["inspect", str(path)]) == 0
        lines = capsys.readouterr().out.splitlines()
        assert lines[1].startswith("model: hy_v3, 3 layers, 8 routed experts (2 per token), 1 shared expert")
        assert ("1 multi-token-prediction layer (kept, not run)" in lines[1]) == mtp
        assert lines[4].startswith("verdict: runs: hy_v3"), lines[4]
