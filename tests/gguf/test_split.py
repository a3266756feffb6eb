"""Models split in parts by llama.cpp's gguf-split layout: any part opens the whole model, with
every tensor's bytes, metadata and hyperparameters of the unsplit file; malformed part sets are
refused with one line naming the part file and what was wrong."""
from __future__ import annotations

import json
import os
import shutil

import numpy as np
import pytest
from gguf import GGUFValueType

from strata.errors import StrataError, StrataFormatError
from strata.gguf import open_model
from strata.gguf.split import PART_ALIGN, SPLIT_KEYS, parse_split_size, part_paths
from .fixtures import WRITERS
from .split_fixture import part_path, rewrite_part, split_gguf, tensor_cuts

V = GGUFValueType


def _same_model(split, whole) -> None:
    assert list(split.tensors) == list(whole.tensors)
    for name, t in whole.tensors.items():
        s = split.tensors[name]
        assert (s.ggml_type, s.shape, s.nbytes) == (t.ggml_type, t.shape, t.nbytes), name
        assert np.array_equal(split.tensor_data(name), whole.tensor_data(name)), name
    assert split.hparams == whole.hparams
    assert {k: v for k, v in split.metadata.items() if k not in SPLIT_KEYS} == whole.metadata
    for layer in whole.expert_layers:
        for e in range(whole.hparams.n_experts):
            for a, b in zip(split.expert_slabs(layer, e), whole.expert_slabs(layer, e)):
                assert np.array_equal(split.expert_data(a), whole.expert_data(b))


@pytest.mark.parametrize("name", sorted(WRITERS))
def test_every_part_opens_the_whole_model(model_files, name, tmp_path):
    src = model_files[name][0]
    parts = split_gguf(src, tmp_path / "m", tensor_cuts(src, 3))
    with open_model(src) as whole:
        for path in parts:
            with open_model(path) as mf:
                assert mf.path == parts[0] and [p.path for p in mf.parts] == parts
                _same_model(mf, whole)


def test_parts_are_one_space_of_offsets(model_files, tmp_path):
    src = model_files["qwen3moe"][0]
    parts = split_gguf(src, tmp_path / "m", tensor_cuts(src, 4))
    with open_model(parts[2]) as mf:
        assert [p.index for p in mf.parts] == [0, 1, 2, 3]
        assert [p.size for p in mf.parts] == [os.path.getsize(p) for p in parts]
        for prev, part in zip(mf.parts, mf.parts[1:]):
            assert part.base % PART_ALIGN == 0 and part.base >= prev.base + prev.size
        assert mf.file_size == mf.parts[-1].base + mf.parts[-1].size
        for part in mf.parts:
            for name in part.tensors:
                t = mf.tensors[name]
                assert mf.part_of(t.offset) == part and part.base <= t.offset
                assert t.offset + t.nbytes <= part.base + part.size
        gap = mf.parts[0].base + mf.parts[0].size
        with pytest.raises(ValueError, match="outside one part"):
            mf._bytes(gap - 4, 8)  # crosses the end of part 1
        mf.check_intact()


def test_an_empty_first_part_and_one_tensor_per_part(model_files, tmp_path):
    """gguf-split --no-tensor-first-split (metadata alone in part 1) and --split-max-tensors 1."""
    src = model_files["mixtral"][0]
    with open_model(src) as whole:
        n = len(whole.tensors)
        empty_first = split_gguf(src, tmp_path / "a", [0, n // 2])
        with open_model(empty_first[0]) as mf:
            assert mf.parts[0].tensors == () and len(mf.parts) == 3
            _same_model(mf, whole)
        singles = split_gguf(src, tmp_path / "b", list(range(1, n)))
        with open_model(singles[-1]) as mf:
            assert len(mf.parts) == n and all(len(p.tensors) == 1 for p in mf.parts)
            _same_model(mf, whole)


def test_gguf_py_agrees_on_every_part(model_files, tmp_path):
    src = model_files["deepseek2"][0]
    parts = split_gguf(src, tmp_path / "m", tensor_cuts(src, 3))
    with open_model(parts[1], cross_check=True) as mf:
        assert len(mf.parts) == 3


def test_architecture_keys_in_other_parts_are_allowed_when_they_agree(model_files, tmp_path):
    src = model_files["qwen2moe"][0]
    parts = split_gguf(src, tmp_path / "m", tensor_cuts(src, 2), arch_in_every_part=True)
    with open_model(parts[1]) as mf, open_model(src) as whole:
        _same_model(mf, whole)


def test_summary_lists_the_parts_and_where_each_layer_lies(model_files, tmp_path):
    src = model_files["qwen3moe"][0]
    parts = split_gguf(src, tmp_path / "m", tensor_cuts(src, 3))
    with open_model(parts[0]) as mf:
        s = json.loads(json.dumps(mf.summary()))
        assert [p["path"] for p in s["parts"]] == [str(p) for p in parts]
        assert [p["file_bytes"] for p in s["parts"]] == [os.path.getsize(p) for p in parts]
        assert s["file_bytes"] == sum(os.path.getsize(p) for p in parts) < mf.file_size  # bytes, not the offsets' end
        assert sum(p["n_tensors"] for p in s["parts"]) == s["n_tensors"]
        assert sum(p["tensor_bytes"] for p in s["parts"]) == s["tensor_bytes"]
        for layer, info in s["expert_layers"].items():
            for kind, part in info["in_part"].items():
                slab = mf.expert(int(layer), 0, kind)
                assert slab.tensor in mf.parts[part - 1].tensors
                assert int(layer) in s["parts"][part - 1]["expert_layers"]
    with open_model(src) as mf:  # one file: one part, no per-layer part
        s = mf.summary()
        assert len(s["parts"]) == 1 and "in_part" not in s["expert_layers"]["0"]


# -- malformed part sets ------------------------------------------------------------------------


@pytest.fixture
def three(model_files, tmp_path):
    """(source file, its three parts)."""
    src = model_files["qwen3moe"][0]
    return src, split_gguf(src, tmp_path / "m", tensor_cuts(src, 3))


def _refused(path, *needles) -> str:
    with pytest.raises(StrataFormatError) as exc:
        open_model(path)
    msg = str(exc.value)
    assert "\n" not in msg, msg
    for needle in needles:
        assert str(needle) in msg, msg
    return msg


def test_a_missing_part_is_named(three):
    _, parts = three
    parts[1].unlink()
    for opened in (parts[0], parts[2]):
        _refused(opened, parts[1], "part 2 of 3", "no such file")
    parts[0].unlink()
    _refused(parts[2], parts[0], "2 of 3 parts missing")


def test_a_renamed_part_is_refused(three):
    _, parts = three
    tmp = parts[1].with_name("swap")
    os.replace(parts[1], tmp)
    os.replace(parts[2], parts[1])
    os.replace(tmp, parts[2])
    _refused(parts[0], parts[1], "split.no", "expected 1", "found 2")
    plain = parts[0].with_name("model.gguf")  # part 1 renamed away from the part names
    os.replace(parts[0], plain)
    _refused(plain, "model.gguf", "file name", "-00001-of-00003.gguf")


def test_a_wrong_count_is_refused(three):
    _, parts = three
    rewrite_part(parts[2], set={"split.count": (4, V.UINT16)})
    _refused(parts[0], parts[2], "split.count", "expected 3", "found 4")
    _refused(parts[2], parts[2], "file name", "-00003-of-00004.gguf")  # opened directly: its name disagrees


def test_a_part_that_is_not_a_part_is_refused(three, tmp_path):
    src, parts = three
    shutil.copyfile(src, parts[1])  # a whole model where part 2 should be
    _refused(parts[0], parts[1], "split.count", "no split.count key")


def test_tensor_count_and_duplicates(model_files, tmp_path):
    src = model_files["qwen3moe"][0]
    cuts = tensor_cuts(src, 3)
    _refused(split_gguf(src, tmp_path / "a", cuts, n_tensors=7)[1], "-00001-of-00003.gguf", "split.tensors.count",
             "found 7")
    dup = split_gguf(src, tmp_path / "b", cuts, extra=["output_norm.weight"])
    _refused(dup[0], dup[2], "output_norm.weight", "each tensor in one part only")
    missing = split_gguf(src, tmp_path / "c", cuts)
    rewrite_part(missing[1], drop_last=True)  # a part holding fewer tensors than the set needs
    _refused(missing[0], "split.tensors.count", "found")


def test_parts_of_another_model_are_refused(model_files, tmp_path):
    a, b = model_files["qwen3moe"][0], model_files["mixtral"][0]
    ours = split_gguf(a, tmp_path / "m", tensor_cuts(a, 3))
    theirs = split_gguf(b, tmp_path / "o", tensor_cuts(b, 3), arch_in_every_part=True)
    shutil.copyfile(theirs[1], ours[1])  # another architecture's part, saying so
    _refused(ours[0], ours[1], "general.architecture", "'qwen3moe'", "'llama'", "another model")
    theirs = split_gguf(b, tmp_path / "p", tensor_cuts(b, 3))
    shutil.copyfile(theirs[2], ours[2])  # silent about its model: caught by its tensor count
    shutil.copyfile(split_gguf(a, tmp_path / "q", tensor_cuts(a, 3))[1], ours[1])
    _refused(ours[0], ours[2], "split.tensors.count", "another split model")


def test_split_keys_of_the_wrong_type_are_refused(three):
    _, parts = three
    rewrite_part(parts[1], set={"split.no": (1, V.UINT32)})
    _refused(parts[0], parts[1], "split.no", "UINT16", "UINT32")


def test_a_truncated_part_is_named(three):
    _, parts = three
    with open(parts[2], "r+b") as f:
        f.truncate(os.path.getsize(parts[2]) - 100)
    _refused(parts[0], parts[2], "truncated")


def test_a_count_of_one_is_a_whole_model(model_files, tmp_path):
    src = model_files["olmoe"][0]
    one = split_gguf(src, tmp_path / "m", [])
    assert one[0].name == "m-00001-of-00001.gguf"
    with open_model(one[0]) as mf, open_model(src) as whole:
        assert len(mf.parts) == 1
        _same_model(mf, whole)


def test_a_part_truncated_while_open_is_caught_before_reading(three):
    _, parts = three
    with open_model(parts[0]) as mf:
        with open(parts[2], "r+b") as f:
            f.truncate(100)
        with pytest.raises(StrataError, match="00003-of-00003.gguf: the file shrank while in use: it is now 100 bytes"):
            mf.check_intact()


# -- names and sizes ----------------------------------------------------------------------------


def test_part_names_follow_llama_cpp(tmp_path):
    assert part_paths(tmp_path / "Model-Q4_K_M.gguf", 1) == [tmp_path / "Model-Q4_K_M.gguf"]
    assert [p.name for p in part_paths(tmp_path / "Model-Q4_K_M.gguf", 3)] == [
        "Model-Q4_K_M-00001-of-00003.gguf", "Model-Q4_K_M-00002-of-00003.gguf", "Model-Q4_K_M-00003-of-00003.gguf"]
    assert part_path(tmp_path / "x", 0, 12).name == "x-00001-of-00012.gguf"


def test_split_sizes_are_llama_cpp_s():
    assert parse_split_size("500M") == 500_000_000
    assert parse_split_size("2G") == 2_000_000_000
    assert parse_split_size("64K") == 64_000
    assert parse_split_size("12345") == 12345
    for bad in ("", "0M", "-1G", "1.5G", "2T", "G", "12 M"):
        with pytest.raises(ValueError, match="split-max-size"):
            parse_split_size(bad)
