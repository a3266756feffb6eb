"""Importance matrices: llama.cpp's GGUF and legacy formats read back, written files read by
gguf-py, bad files refused with the file and tensor named, and `strata imatrix` on a tiny model."""
import struct
import subprocess
import sys

import gguf
import numpy as np
import pytest

from converters.calib.imatrix import read_imatrix, write_imatrix
from converters.source import ConversionError


def test_gguf_round_trip_and_gguf_py(tmp_path):
    sums = {"blk.0.attn_q.weight": np.arange(1, 9, dtype=np.float32)[None, :] * 4,
            "blk.0.ffn_up_exps.weight": np.array([[1, 2, 3, 4, 5, 6, 7, 8], [0] * 8, [2] * 8], dtype=np.float32)}
    counts = {"blk.0.attn_q.weight": np.array([4.0]), "blk.0.ffn_up_exps.weight": np.array([1.0, 0.0, 2.0])}
    path = tmp_path / "m.imatrix"
    write_imatrix(path, sums, counts, ["calib.txt"], 3, 512)
    r = gguf.GGUFReader(path)
    assert r.fields["general.type"].contents() == "imatrix"
    assert r.fields["imatrix.datasets"].contents() == ["calib.txt"]
    assert r.fields["imatrix.chunk_count"].contents() == 3 and r.fields["imatrix.chunk_size"].contents() == 512
    shapes = {t.name: t.shape.tolist() for t in r.tensors}
    assert shapes["blk.0.ffn_up_exps.weight.in_sum2"] == [8, 3]  # ggml order: K, nmat
    assert shapes["blk.0.ffn_up_exps.weight.counts"] == [1, 3]
    m = read_imatrix(path)
    np.testing.assert_allclose(m.importance("blk.0.attn_q.weight", (16, 8)), np.arange(1, 9)[None, :])
    imp = m.importance("blk.0.ffn_up_exps.weight", (3, 16, 8))
    np.testing.assert_allclose(imp[0], np.arange(1, 9))
    np.testing.assert_allclose(imp[2], 1.0)
    np.testing.assert_allclose(imp[1], (imp[0] + imp[2]) / 2)  # never routed to: the layer's average
    assert m.importance("blk.1.attn_q.weight", (16, 8)) is None


def _legacy(entries, chunks=7, dataset=b"wiki.txt"):
    out = struct.pack("<i", len(entries))
    for name, ncall, values in entries:
        out += struct.pack("<i", len(name)) + name + struct.pack("<ii", ncall, len(values))
        out += struct.pack(f"<{len(values)}f", *values)
    return out + struct.pack("<i", chunks) + struct.pack("<i", len(dataset)) + dataset


def test_legacy_format(tmp_path):
    path = tmp_path / "legacy.dat"
    path.write_bytes(_legacy([(b"blk.0.attn_v.weight", 10, [10.0, 20.0, 30.0, 40.0]),
                              (b"blk.0.ffn_down_exps.weight", 10, [1.0] * 4 + [3.0] * 4)]))
    m = read_imatrix(path)
    assert m.chunk_count == 7 and m.datasets == ["wiki.txt"]
    np.testing.assert_allclose(m.importance("blk.0.attn_v.weight", (2, 4)), [[1, 2, 3, 4]])
    np.testing.assert_allclose(m.importance("blk.0.ffn_down_exps.weight", (2, 3, 4)), [[0.1] * 4, [0.3] * 4])


def test_bad_files_name_file_and_tensor(tmp_path):
    trunc = tmp_path / "trunc.dat"
    trunc.write_bytes(_legacy([(b"blk.0.attn_v.weight", 1, [1.0] * 8)])[:30])
    with pytest.raises(ConversionError, match=r"trunc\.dat.*blk\.0\.attn_v\.weight"):
        read_imatrix(trunc)
    not_imatrix = tmp_path / "model.gguf"
    w = gguf.GGUFWriter(str(not_imatrix), "llama")
    w.add_tensor("x", np.zeros(4, np.float32))
    w.write_header_to_file(); w.write_kv_data_to_file(); w.write_tensors_to_file(); w.close()
    with pytest.raises(ConversionError, match=r"model\.gguf.*not 'imatrix'"):
        read_imatrix(not_imatrix)
    ok = tmp_path / "ok.imatrix"
    write_imatrix(ok, {"blk.0.attn_q.weight": np.ones((1, 8), np.float32)}, {"blk.0.attn_q.weight": np.ones(1)}, [], 1, 8)
    with pytest.raises(ConversionError, match=r"ok\.imatrix: tensor blk\.0\.attn_q\.weight.*rows of 6"):
        read_imatrix(ok).importance("blk.0.attn_q.weight", (4, 6))
    with pytest.raises(ConversionError, match="cannot read"):
        read_imatrix(tmp_path / "missing")


def test_strata_imatrix_command(tmp_path):
    from tests.fixtures.tiny import zoo
    from strata.synth.tokenizer import corpus
    tiny = zoo().get("mixtral")
    text = tmp_path / "calib.txt"
    text.write_text(" ".join(corpus(400, seed=1)))
    out = tmp_path / "mixtral.imatrix"
    subprocess.run([sys.executable, "-m", "strata", "imatrix", str(tiny.gguf("f32")), "-f", str(text), "-o", str(out),
                    "--ctx", "128", "--chunks", "2", "--no-progress"], check=True, capture_output=True, text=True)
    r = gguf.GGUFReader(out)
    assert r.fields["imatrix.chunk_count"].contents() == 2 and r.fields["imatrix.chunk_size"].contents() == 128
    tensors = {t.name: np.array(t.data) for t in r.tensors}
    for layer in (0, 1):
        for part in ("attn_q", "attn_k", "attn_v", "attn_output"):
            assert tensors[f"blk.{layer}.{part}.weight.counts"].ravel().tolist() == [256.0]
            assert (tensors[f"blk.{layer}.{part}.weight.in_sum2"] > 0).all()
        counts = tensors[f"blk.{layer}.ffn_gate_exps.weight.counts"].ravel()
        assert counts.shape == (4,) and counts.sum() == 256 * 2  # top-2 of 4 experts
        assert tensors[f"blk.{layer}.ffn_down_exps.weight.in_sum2"].shape == (4, 256)
    # q, k and v read the same input: the same sums
    assert np.array_equal(tensors["blk.0.attn_q.weight.in_sum2"], tensors["blk.0.attn_v.weight.in_sum2"])
    m = read_imatrix(out)
    assert m.importance("blk.1.ffn_up_exps.weight", (4, 256, 256)).shape == (4, 256)
