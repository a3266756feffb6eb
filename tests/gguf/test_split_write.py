"""Strata writes split models in llama.cpp's gguf-split layout: `python -m strata.convert
--split-max-size` and `strata synth --split-max-size` write NAME-0000i-of-0000n.gguf parts (a
tensor never split, metadata in part 1 only, temporary names renamed when every part is complete)
holding the unsplit file's tensors byte for byte; llama.cpp runs them with the unsplit file's
logits; `strata inspect` shows the parts."""
from __future__ import annotations

import io
import json
import subprocess
import sys
import types

import numpy as np
import pytest
from gguf import GGUFReader

import converters
from converters import TypePolicy, convert
from converters.source import ConversionError
from strata.cli import main
from strata.commands import inspect as inspect_cmd
from strata.gguf import open_model
from strata.gguf.split import SPLIT_KEYS
from strata.synth import build_checkpoint
from strata.synth.gguf_file import Shape, write

from .split_fixture import split_gguf, tensor_cuts

SHAPE = Shape(n_layers=3, n_experts=8, top_k=2, hidden=256, ff=256, n_head=2, n_head_kv=1, vocab=512)


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    root = tmp_path_factory.mktemp("split-write")
    hf = build_checkpoint(root / "hf", seed=4, num_hidden_layers=3, num_experts=8, num_experts_per_tok=2)
    whole = root / "whole.gguf"
    convert(hf, whole, TypePolicy(), name="split-write", n_threads=2)
    return hf, whole


def _tensor_bytes(path) -> int:
    return sum(int(t.n_bytes) for t in GGUFReader(path).tensors)


def _check_parts(parts, whole, max_size: int) -> None:
    """llama.cpp's layout: names, split keys, metadata only in part 1, no tensor split, bytes equal."""
    n = len(parts)
    assert n >= 3 and [p.name.rsplit("-", 3)[-3:] for p in parts] == [
        [f"{i + 1:05d}", "of", f"{n:05d}.gguf"] for i in range(n)]
    first_keys = None
    for i, part in enumerate(parts):
        reader = GGUFReader(part)
        keys = {k for k in reader.fields if not k.startswith("GGUF.")}
        assert (reader.fields["split.no"].contents(), reader.fields["split.count"].contents()) == (i, n)
        assert reader.fields["split.tensors.count"].contents() == len(GGUFReader(whole).tensors)
        assert [reader.fields[k].types[0].name for k in SPLIT_KEYS] == ["UINT16", "UINT16", "INT32"]
        if i == 0:
            first_keys = keys
        else:
            assert keys == set(SPLIT_KEYS), part  # the model's metadata is in part 1 only
        assert _tensor_bytes(part) <= max_size or len(reader.tensors) == 1
    assert first_keys - set(SPLIT_KEYS) == {k for k in GGUFReader(whole).fields if not k.startswith("GGUF.")}
    with open_model(parts[1]) as mf, open_model(whole) as ref:
        assert list(mf.tensors) == list(ref.tensors)
        for name in ref.tensors:
            assert np.array_equal(mf.tensor_data(name), ref.tensor_data(name)), name


def test_convert_writes_llama_cpp_parts(checkpoint, tmp_path):
    hf, whole = checkpoint
    max_size = _tensor_bytes(whole) // 4
    convert(hf, tmp_path / "m.gguf", TypePolicy(), name="split-write", n_threads=2, split_max_size=max_size)
    parts = sorted(tmp_path.iterdir())
    assert all(p.name.startswith("m-0000") for p in parts), parts  # no temporary file, no m.gguf
    _check_parts(parts, whole, max_size)


def test_convert_fitting_in_one_part_writes_one_file(checkpoint, tmp_path):
    hf, whole = checkpoint
    convert(hf, tmp_path / "m.gguf", TypePolicy(), name="split-write", n_threads=2, split_max_size=1 << 40)
    assert [p.name for p in tmp_path.iterdir()] == ["m.gguf"]
    assert "split.count" not in GGUFReader(tmp_path / "m.gguf").fields


def test_an_interrupted_split_conversion_leaves_nothing(checkpoint, tmp_path, monkeypatch):
    hf, whole = checkpoint
    calls = []
    write_part = converters.writer._write_part

    def fail_on_third(*args, **kw):
        calls.append(1)
        if len(calls) == 3:
            raise OSError(28, "No space left on device")
        return write_part(*args, **kw)

    monkeypatch.setattr(converters.writer, "_write_part", fail_on_third)
    with pytest.raises(ConversionError, match="No space left"):
        convert(hf, tmp_path / "m.gguf", TypePolicy(), n_threads=2, split_max_size=_tensor_bytes(whole) // 4)
    assert len(calls) == 3 and list(tmp_path.iterdir()) == []


def test_convert_cli_split_max_size(checkpoint, tmp_path):
    hf, whole = checkpoint
    kb = _tensor_bytes(whole) // 3 // 1000
    res = subprocess.run([sys.executable, "-m", "strata.convert", str(hf), "-o", str(tmp_path / "c.gguf"),
                          "--split-max-size", f"{kb}K", "--no-progress", "--threads", "2"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr
    _check_parts(sorted(tmp_path.glob("c-*.gguf")), whole, kb * 1000)
    res = subprocess.run([sys.executable, "-m", "strata.convert", str(hf), "-o", str(tmp_path / "d.gguf"),
                          "--split-max-size", "12X"], capture_output=True, text=True)
    err = res.stderr.strip()
    assert res.returncode == 1 and err.startswith("strata: error:") and "\n" not in err and "12X" in err, err
    assert not list(tmp_path.glob("d*"))


def test_synth_writes_parts_equal_to_the_unsplit_file(tmp_path):
    whole = write(tmp_path / "whole.gguf", SHAPE, drop_cache=False)
    max_size = _tensor_bytes(whole) // 4
    first = write(tmp_path / "s.gguf", SHAPE, drop_cache=False, split_max_size=max_size)
    parts = sorted(tmp_path.glob("s-*.gguf"))
    assert first == parts[0] and not list(tmp_path.glob("*.partial"))
    _check_parts(parts, whole, max_size)


def test_synth_cli_split_max_size(tmp_path, capsys):
    out = tmp_path / "x.gguf"
    args = ["synth", str(out), "--layers", "3", "--experts", "8", "--top-k", "2", "--hidden", "256", "--ff", "256",
            "--heads", "2", "--heads-kv", "1", "--quiet"]
    assert main([*args, "--split-max-size", "1M"]) == 0
    parts = sorted(tmp_path.glob("x-*.gguf"))
    assert len(parts) >= 2 and not out.exists() and str(parts[0]) in capsys.readouterr().out
    with open_model(parts[-1]) as mf:
        assert len(mf.parts) == len(parts) and mf.hparams.n_experts == 8
    assert main([*args, "--split-max-size", "1.5G"]) == 1
    err = capsys.readouterr().err.strip()
    assert err.startswith("strata: error:") and "\n" not in err and "--split-max-size" in err


def test_inspect_shows_the_parts(checkpoint, tmp_path):
    hf, whole = checkpoint
    parts = split_gguf(whole, tmp_path / "m", tensor_cuts(whole, 3))
    res = subprocess.run([sys.executable, "-m", "strata", "inspect", str(parts[2]), "--raw"], capture_output=True,
                         text=True)
    assert res.returncode == 0, res.stderr
    assert "in 3 parts" in res.stdout.splitlines()[2] and "parts: 3 files" in res.stdout
    for i, part in enumerate(parts):
        assert f"    {i + 1}: {part}: " in res.stdout
    assert "in_part:" in res.stdout
    out = io.StringIO()
    assert inspect_cmd.run(types.SimpleNamespace(model=str(parts[0]), json=True), out) == 0
    summary = json.loads(out.getvalue())
    assert [p["path"] for p in summary["parts"]] == [str(p) for p in parts]
    assert all(set(info["in_part"]) == {"gate", "up", "down"} for info in summary["expert_layers"].values())
    res = subprocess.run([sys.executable, "-m", "strata", "inspect", str(whole), "--raw"], capture_output=True,
                         text=True)
    assert "parts:" not in res.stdout and "in_part" not in res.stdout  # one file: as before


@pytest.mark.interop
def test_llama_cpp_runs_split_parts_as_the_unsplit_file(checkpoint, tmp_path):
    llama_cpp = pytest.importorskip("llama_cpp")
    hf, whole = checkpoint
    convert(hf, tmp_path / "m.gguf", TypePolicy(), name="split-write", n_threads=2,
            split_max_size=_tensor_bytes(whole) // 4)
    synth_whole = write(tmp_path / "sw.gguf", SHAPE, drop_cache=False)
    synth_first = write(tmp_path / "s.gguf", SHAPE, drop_cache=False, split_max_size=_tensor_bytes(synth_whole) // 3)
    ids = [5, 17, 42, 99, 3, 250, 7, 11]

    def logits(path) -> np.ndarray:
        llm = llama_cpp.Llama(model_path=str(path), n_ctx=64, n_batch=64, logits_all=True, n_threads=1,
                              verbose=False)
        try:
            llm.eval(ids)
            return np.array(llm.scores[:len(ids)], dtype=np.float32)
        finally:
            llm.close()

    theirs = split_gguf(whole, tmp_path / "g", tensor_cuts(whole, 3))  # the fixture's layout is llama.cpp's too
    for first, ref in ((sorted(tmp_path.glob("m-*.gguf"))[0], whole), (synth_first, synth_whole), (theirs[0], whole)):
        want, got = logits(ref), logits(first)
        assert np.isfinite(want).all() and np.array_equal(got, want), float(np.abs(got - want).max())
