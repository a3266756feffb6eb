"""pyproject's dependency floors are versions the code runs on: torch's allows no release
without what the attention uses (`enable_gqa`, torch 2.5) and none newer than the one tested."""
from __future__ import annotations

import re
import tomllib
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in re.match(r"\d+(\.\d+)*", text).group(0).split("."))


def test_torch_floor_is_a_tested_version_with_enable_gqa():
    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    spec = next(d for d in deps if re.match(r"torch\b", d))
    floor = _version(spec.split(">=", 1)[1])
    assert floor >= (2, 5), f"{spec}: scaled_dot_product_attention(enable_gqa=...) needs torch 2.5"
    assert floor[:2] <= _version(torch.__version__)[:2], f"{spec}: newer than the torch tested ({torch.__version__})"
