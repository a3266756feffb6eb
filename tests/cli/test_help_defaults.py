"""Help texts state the defaults the code applies, generated from the constants (strata.defaults)
rather than written out: `--prefetch-depth` on the CPU is 0, as TieredConfig decides it."""
from __future__ import annotations

import re

import torch

from strata.cli import build_parser
from strata.defaults import (DEFAULT_CTX, DEFAULT_HOST_FRACTION, DEFAULT_PREFETCH_DEPTH, KV_BLOCK_SIZE,
                             MAX_STEP_TOKENS)
from strata.engine import BLOCK_SIZE
from strata.memory.budget import TieredConfig


def _help(*argv: str) -> str:
    parser = build_parser()
    sub = parser._subparsers._group_actions[0].choices[argv[0]]
    for name in argv[1:]:
        sub = sub._subparsers._group_actions[0].choices[name]
    return re.sub(r"\s+", " ", sub.format_help())


def test_generate_help_states_the_applied_defaults():
    text = _help("generate")
    cpu, cuda = TieredConfig().depth_for(torch.device("cpu")), DEFAULT_PREFETCH_DEPTH["cuda"]
    assert cpu == 0 and f"(default {cuda} on cuda, {cpu} on cpu;" in text
    assert f"(default {MAX_STEP_TOKENS})" in text and f"blocks of {BLOCK_SIZE} positions" in text
    assert f"min(model's, {DEFAULT_CTX})" in text and f"{100 * DEFAULT_HOST_FRACTION:g}% of available RAM" in text
    assert BLOCK_SIZE == KV_BLOCK_SIZE


def test_help_follows_the_constants(monkeypatch):
    monkeypatch.setitem(DEFAULT_PREFETCH_DEPTH, "cpu", 3)
    monkeypatch.setattr("strata.commands.common.MAX_STEP_TOKENS", 777)
    text = _help("chat")
    assert "3 on cpu" in text and "(default 777)" in text
    assert "(default 3 on cpu," in _help("bench", "ladder")


def test_inspect_and_bench_help_show_their_argparse_defaults():
    assert f"(default {DEFAULT_CTX})" in _help("inspect")
    assert "(default 32)" in _help("bench", "ladder") and "(default 16)" in _help("bench", "pager")
