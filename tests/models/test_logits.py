"""Strata's logits equal transformers' on the source model, for every architecture (f32 GGUF)."""
from __future__ import annotations

import torch

from tests.fixtures.tiny import GGUF_ARCH

from .helpers import REL_TOL, Bare, rel_err

N_PREFILL, N_DECODE = 20, 16


def test_prefill_and_each_decode_step_match_transformers(tiny):
    bare = Bare(tiny.gguf("f32"))
    assert bare.mf.arch == GGUF_ARCH[tiny.key]
    ids = tiny.prompt_ids(N_PREFILL + N_DECODE)
    ref = tiny.hf_logits(ids)  # [T, V]
    prefill = bare.forward(ids[:N_PREFILL], 0)
    assert rel_err(prefill, ref[:N_PREFILL]) <= REL_TOL
    for pos in range(N_PREFILL, N_PREFILL + N_DECODE):
        step = bare.forward([ids[pos]], pos)[0]
        assert rel_err(step, ref[pos]) <= REL_TOL, f"decode step at position {pos}"


def test_greedy_32_tokens_match_transformers(tiny):
    prompt = tiny.prompt_ids(16, seed=5)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(32):  # transformers' greedy path, one full forward per token
            ids.append(int(tiny.model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert Bare(tiny.gguf("f32")).greedy(prompt, 32) == ids[16:]


def test_chunked_expert_acquire_gives_the_same_logits(tiny):
    """max_acquire=1 runs every expert in its own acquire/release round: same maths, same order."""
    ids = tiny.prompt_ids(24)
    whole = Bare(tiny.gguf("f32")).forward(ids, 0)
    one_by_one = Bare(tiny.gguf("f32"), max_acquire=1).forward(ids, 0)
    assert torch.equal(whole, one_by_one)


def test_prefill_in_pieces_equals_one_prefill(tiny):
    """A prompt fed as 7 + 9 + 8 tokens (cached prefix, causal mask offset) gives the same logits."""
    ids = tiny.prompt_ids(24)
    ref = Bare(tiny.gguf("f32")).forward(ids, 0)
    bare = Bare(tiny.gguf("f32"))
    pieces = [bare.forward(ids[a:b], a) for a, b in ((0, 7), (7, 16), (16, 24))]
    assert rel_err(torch.cat(pieces), ref) <= 1e-5
