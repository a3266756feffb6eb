"""Build a Strata model straight from a GGUF file (no engine) for model-level tests."""
from __future__ import annotations

import pytest
import torch

import strata
from strata.engine.kv_cache import KVCache
from strata.gguf import open_model
from strata.memory import DirectExpertMemory
from strata.models import cache_dims, cache_states, load_model
from tests.fixtures.tiny import zoo

#: Acceptance bound: max |strata - transformers| <= REL_TOL * max |transformers logit|.
REL_TOL = 1e-4


class Bare:
    """A loaded model with a paged KV cache of `n_slots` sequences (slots 0..n_slots-1, all
    allocated), stepping sequences by hand."""

    def __init__(self, path, n_ctx: int = 128, n_slots: int = 1, max_acquire: int | None = None):
        self.mf = open_model(path)
        hp = self.mf.hparams
        self.memory = DirectExpertMemory(self.mf, max_acquire=max_acquire)
        self.model = load_model(self.mf, self.memory)
        self.cache = KVCache(hp.n_layers, n_slots, n_ctx, *cache_dims(hp), states=cache_states(hp))
        self.slots = [self.cache.allocate() for _ in range(n_slots)]

    def forward(self, ids: list[int], start: int, slot: int = 0, all_logits: bool = True) -> torch.Tensor:
        return self.model(torch.tensor(ids), self.cache.batch([slot], [start], [len(ids)]), self.cache, all_logits)

    def greedy(self, prompt: list[int], n: int) -> list[int]:
        logits = self.forward(prompt, 0, all_logits=False)[0]
        out = []
        for _ in range(n):
            out.append(int(logits.argmax()))
            logits = self.forward(out[-1:], len(prompt) + len(out) - 1)[0]
        return out


def rel_err(got: torch.Tensor, ref: torch.Tensor) -> float:
    return float((got - ref).abs().max() / ref.abs().max())


def packed_decode_error(tiny, n_decode: int, check=None) -> float:
    """The fixture's f32 file prefilled with 12 tokens, then decoded a token at a time on the float
    path (greedy) and with packed compute on the same tokens: the largest relative error of the
    packed path's logits over every step. `check(bare)` sees the packed model before it runs."""
    path, runs = tiny.gguf("f32"), []
    for compute in ("float", "packed"):
        bare = Bare(path)
        if compute == "packed":
            bare.model = load_model(bare.mf, DirectExpertMemory(bare.mf), compute="packed")
            if check is not None:
                check(bare)
        prompt = tiny.prompt_ids(12)
        logits, ids = [bare.forward(prompt, 0, all_logits=False)[0]], list(prompt)
        for _ in range(n_decode):
            ids.append(int(logits[-1].argmax()) if compute == "float" else runs[0][1][len(ids)])
            logits.append(bare.forward(ids[-1:], len(ids) - 1)[0])
        runs.append((logits, ids))
    (want, _), (got, _) = runs
    return max(rel_err(b, a) for a, b in zip(want, got))


def check_prefill_and_decode(tiny, record_property, arch: str, n_prefill: int = 20, n_decode: int = 16) -> None:
    """The fixture's f32 file, prefilled and then decoded a token at a time, matches transformers'
    logits within REL_TOL of their range at every step."""
    bare = Bare(tiny.gguf("f32"))
    assert bare.mf.arch == arch
    ids = tiny.prompt_ids(n_prefill + n_decode)
    ref = tiny.hf_logits(ids)  # [T, V]
    errs = [rel_err(bare.forward(ids[:n_prefill], 0), ref[:n_prefill])]
    errs += [rel_err(bare.forward([ids[p]], p)[0], ref[p]) for p in range(n_prefill, n_prefill + n_decode)]
    record_property("max_rel_err", max(errs))
    assert max(errs) <= REL_TOL, errs


def check_greedy_32(tiny) -> None:
    """32 greedy tokens after a 16-token prompt: the f32 file's are transformers'."""
    prompt = tiny.prompt_ids(16, seed=5)
    ids = list(prompt)
    with torch.no_grad():
        for _ in range(32):
            ids.append(int(tiny.model(torch.tensor([ids])).logits[0, -1].argmax()))
    assert Bare(tiny.gguf("f32")).greedy(prompt, 32) == ids[16:]


def check_batch_of_two(tiny) -> None:
    """Two sequences of different lengths prefilled in one batch, then decoded together, give the
    logits each gives alone (its own cache slot, its own positions)."""
    a, b = tiny.prompt_ids(13, seed=1), tiny.prompt_ids(9, seed=2)
    alone = []
    for ids in (a, b):
        bare = Bare(tiny.gguf("f32"))
        alone.append([bare.forward(ids[:-3], 0)] + [bare.forward([ids[p]], p) for p in range(len(ids) - 3, len(ids))])
    pair = Bare(tiny.gguf("f32"), n_slots=2)
    n_a, n_b = len(a) - 3, len(b) - 3
    both = pair.model(torch.tensor(a[:n_a] + b[:n_b]), pair.cache.batch([0, 1], [0, 0], [n_a, n_b]), pair.cache, True)
    assert rel_err(both[:n_a], alone[0][0]) <= 1e-5 and rel_err(both[n_a:], alone[1][0]) <= 1e-5
    for step in range(3):
        pos_a, pos_b = n_a + step, n_b + step
        batch = pair.cache.batch([0, 1], [pos_a, pos_b], [1, 1])
        out = pair.model(torch.tensor([a[pos_a], b[pos_b]]), batch, pair.cache, True)
        assert rel_err(out[0], alone[0][step + 1][0]) <= 1e-5 and rel_err(out[1], alone[1][step + 1][0]) <= 1e-5


def tiny_fixture(key: str):
    """A test module's `tiny` fixture: the zoo's model `key`, one for the module."""
    return pytest.fixture(scope="module", name="tiny")(lambda: zoo().get(key))


def load(path, compute: str = "float", memory: str = "direct", max_batch: int = 1):
    """`strata.load` as the family tests run it: one thread, 128 positions."""
    return strata.load(path, threads=1, n_ctx=128, max_batch=max_batch, compute=compute, memory=memory)


def check_chunked_prefill(tiny) -> None:
    """A prompt in chunks of 5, 1 and 7 tokens gives transformers' logits: the state carried
    between chunks (a recurrent layer's conv state shorter and longer than a chunk) moves on."""
    ids = tiny.prompt_ids(13)
    ref, bare, got, p = tiny.hf_logits(ids), Bare(tiny.gguf("f32")), [], 0
    for n in (5, 1, 7):
        got.append(bare.forward(ids[p:p + n], p))
        p += n
    assert rel_err(torch.cat(got), ref) <= REL_TOL


def check_packed_every_memory(tiny, check=None) -> None:
    """Packed compute equals float on the f32 file (within 1e-5) in every memory and picks
    float's greedy tokens; `check(model, memory)` sees each packed model too."""
    ids, prompt = tiny.prompt_ids(40), tiny.prompt_ids(16, seed=21)
    with load(tiny.gguf("f32")) as ref:
        want = ref.logits(ids)
        greedy = ref.generate(prompt, temperature=0, max_tokens=24, stop_token_ids=()).token_ids
    for memory in ("direct", "paged", "tiered"):
        with load(tiny.gguf("f32"), "packed", memory) as m:
            assert rel_err(m.logits(ids), want) < 1e-5, memory
            if check is not None:
                check(m, memory)
            assert m.generate(prompt, temperature=0, max_tokens=24, stop_token_ids=()).token_ids == greedy


def check_generate_batch(tiny) -> None:
    """The engine's continuous batching: two prompts of different lengths decoded together with
    packed compute give each one's tokens alone."""
    prompts = [tiny.prompt_ids(11, seed=3), tiny.prompt_ids(6, seed=4)]
    with load(tiny.gguf("f32"), "packed", max_batch=2) as m:
        alone = [m.generate(p, temperature=0, max_tokens=20, stop_token_ids=()).token_ids for p in prompts]
        both = [c.token_ids for c in m.generate_batch(prompts, temperature=0, max_tokens=20, stop_token_ids=())]
    assert both == alone
