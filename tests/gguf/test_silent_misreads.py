"""Values no later check would catch are refused where they enter: routing statistics with NaN
or infinite counts at conversion (not only at load), non-zero padding after the tensor table."""
from __future__ import annotations

import numpy as np
import pytest

from strata.errors import StrataFormatError
from strata.gguf import open_model
from strata.gguf.routing import load_routing_npz

from .fixtures import copy, data_offset, patch


@pytest.mark.parametrize("bad", [np.nan, np.inf, -np.inf])
def test_routing_npz_with_non_finite_counts_is_refused(tmp_path, bad):
    path = tmp_path / "routing.npz"
    counts = np.ones((2, 4))
    counts[1, 2] = bad
    np.savez(path, counts=counts, tokens=np.int64(10))
    with pytest.raises(StrataFormatError, match=r"routing.npz: routing statistics: expected finite numeric counts, "
                                                r"found NaN or infinite counts"):
        load_routing_npz(path, 2, 4)


def test_routing_npz_with_text_counts_is_refused(tmp_path):
    path = tmp_path / "routing.npz"
    np.savez(path, counts=np.array([["a"] * 4] * 2), tokens=np.int64(10))
    with pytest.raises(StrataFormatError, match="expected finite numeric counts, found <U1"):
        load_routing_npz(path, 2, 4)


def test_non_zero_padding_after_the_tensor_table_is_refused(model_files, tmp_path):
    src = model_files["qwen3moe"][0]
    start = data_offset(src)
    with open(src, "rb") as f:
        f.seek(start - 32)
        pad = f.read(32)
    assert pad.endswith(b"\0"), "the fixture has padding before its data"
    bad = patch(copy(src, tmp_path / "pad.gguf"), start - 1, "B", 0x5A)
    with pytest.raises(StrataFormatError, match=rf"pad.gguf: padding after the tensor table: expected zero bytes up to "
                                                rf"the data at {start}, found a non-zero byte at offset {start - 1}"):
        open_model(bad)
