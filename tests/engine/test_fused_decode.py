"""The fused decode step of packed compute (strata.runtime.step: a layer's attention half and
router in one native call, its routed experts in the fused MoE call) and the decode program
(strata.runtime.program: every layer in one call) give exactly the bytes of the per-call path they
replace, on every architecture's fixture, for one sequence and for a batch of sequences at
different positions, also when the program hands a layer back to the expert memory; and their
native entry points refuse bad arguments.
"""
from __future__ import annotations

import pytest
import torch

import strata
from strata import native, runtime
from strata.errors import NativeError

STEPS = 12


def _decode_logits(model, prompts: list[list[int]], mode: str = "program") -> list[torch.Tensor]:
    """Prefill each prompt in its own slot, then STEPS batched greedy decode steps: the logits
    [B, V] of every step. mode: "program" (as loaded), "fused" (per-block fused steps, no
    program) or "per_call"."""
    run = model.runner if mode == "program" else model.runner.with_decode(
        {"fused": runtime.FUSED, "per_call": runtime.PACKED}[mode])
    slots = [model.cache.allocate() for _ in prompts]
    try:
        last = []
        for slot, ids in zip(slots, prompts):
            batch = model.cache.batch([slot], [0], [len(ids)])
            last.append(int(run(torch.tensor(ids), batch, model.cache)[0].argmax()))
        starts, out = [len(p) for p in prompts], []
        for _ in range(STEPS):
            batch = model.cache.batch(slots, starts, [1] * len(slots))
            logits = run(torch.tensor(last), batch, model.cache)  # [B, V]
            out.append(logits.clone())
            last, starts = logits.argmax(-1).tolist(), [s + 1 for s in starts]
        return out
    finally:
        for s in slots:
            model.cache.free(s)


def _check_fused_equals_per_call(tiny, model) -> None:
    """The fused steps and the decode program give the per-call path's bytes, one sequence and
    three at different positions."""
    for prompts in ([tiny.prompt_ids(7, seed=1)],
                    [tiny.prompt_ids(5, seed=2), tiny.prompt_ids(19, seed=3), tiny.prompt_ids(11, seed=4)]):
        per_call = _decode_logits(model, prompts, "per_call")
        for mode in ("fused", "program"):
            for a, b in zip(_decode_logits(model, prompts, mode), per_call):
                assert torch.equal(a, b), mode


def _has_program(tiny, model) -> bool:
    """The program takes every fixture whose blocks are fused (shared experts included)."""
    assert model.plan.decode == runtime.PROGRAM and model.runner.program is not None, (tiny, model.plan)
    return True


@pytest.mark.parametrize("outtype", ["q8_0", None], ids=["q8_0", "default"])
def test_fused_decode_equals_the_per_call_path(tiny, outtype):
    with strata.load(tiny.gguf(outtype), threads=2, n_ctx=128, max_batch=3, compute="packed",
                     memory="direct") as m:
        assert all(s is not None for s in m.runner.steps)
        _has_program(tiny, m)
        _check_fused_equals_per_call(tiny, m)


def test_program_hands_layers_with_missing_experts_to_the_memory(tiny):
    """A page table row with experts not in place (-1) stops the program after that layer's
    attention half; the memory computes the layer's experts and the program resumes: the same
    bytes, and the layers the program ran report their routing to the memory."""
    with strata.load(tiny.gguf(None), threads=2, n_ctx=128, max_batch=3, compute="packed", memory="direct") as m:
        _has_program(tiny, m)
        prog = m.runner.program
        first, last = prog.model_layers[prog.moe[0]], prog.model_layers[prog.moe[-1]]  # MoE layers
        prog.fixed[prog.moe[0]][1][::2] = -1  # half the first MoE layer's experts "not in place"
        acquired, served = [], []
        start, served_fixed = m.memory.start, m.memory.served_fixed
        m.memory.start = lambda layer, ids: (acquired.append(layer), start(layer, ids))[1]
        m.memory.served_fixed = lambda layer, ids, n: (served.append(layer), served_fixed(layer, ids, n))[1]
        prompts = [tiny.prompt_ids(6, seed=7), tiny.prompt_ids(13, seed=8)]
        got = _decode_logits(m, prompts)
        # prefill acquires every layer; decode only the first one's missing experts
        assert served.count(last) == STEPS and acquired.count(first) > acquired.count(last)
        for a, b in zip(got, _decode_logits(m, prompts, "per_call")):
            assert torch.equal(a, b)


def test_fused_decode_under_tiered_memory_equals_direct(tiny):
    path = tiny.gguf(None)
    prompts = [tiny.prompt_ids(9, seed=5), tiny.prompt_ids(4, seed=6)]
    with strata.load(path, threads=1, n_ctx=128, max_batch=2, compute="packed", memory="direct") as direct, \
            strata.load(path, threads=1, n_ctx=128, max_batch=2, compute="packed", memory="tiered") as tiered:
        assert tiered.plan.memory == "paged"  # on the CPU the paged memory serves memory='tiered'
        assert all(s is not None for s in tiered.runner.steps)
        for a, b in zip(_decode_logits(direct, prompts, "fused"), _decode_logits(tiered, prompts, "fused")):
            assert torch.equal(a, b)


def _evicting_paged(path) -> dict:
    """strata.load's memory options: the paged memory with top-k + 1 RAM slots per layer."""
    from strata.gguf import open_model
    from strata.memory.budget import host_budget_for_slots

    with open_model(path) as mf:
        return dict(memory="paged", host_mem=host_budget_for_slots(mf, mf.hparams.n_experts_used + 1))


def program_and_blocks_equal_direct(tiny, direct, prog, blocks, prompts, keys) -> dict:
    """Decode `prompts` through the program (prog) and the per-block path (blocks): both give
    direct memory's logits and the same memory counters `keys`. Returns the program's totals."""
    _has_program(tiny, prog)
    want = _decode_logits(direct, prompts, "per_call")
    for mode, m in (("program", prog), ("fused", blocks)):
        for a, b in zip(_decode_logits(m, prompts, mode), want):
            assert torch.equal(a, b), mode
    a, b = prog.memory_stats().totals(), blocks.memory_stats().totals()
    for key in keys:
        assert a[key] == b[key], key
    return a


def test_program_under_evicting_memory_equals_the_per_block_path(tiny):
    """Fewer RAM slots than experts (the paged memory): the program runs the layers whose experts
    are all in the pool and hands the others to the memory, which loads and evicts in acquire. The logits equal direct memory's, and the hits, misses, evictions and disk reads equal
    those of the per-block path (the program's reported hits count in the eviction policy as
    acquire's do)."""
    path = tiny.gguf(None)
    kw = dict(threads=1, n_ctx=128, max_batch=2, compute="packed", **_evicting_paged(path))
    prompts = [tiny.prompt_ids(9, seed=11), tiny.prompt_ids(5, seed=12)]
    with strata.load(path, threads=1, n_ctx=128, max_batch=2, compute="packed", memory="direct") as direct, \
            strata.load(path, **kw) as prog, strata.load(path, **kw) as blocks:
        assert prog.memory.host.slots_per_layer < prog.memory.n_experts
        a = program_and_blocks_equal_direct(tiny, direct, prog, blocks, prompts,
                                            ("requests", "device_hits", "device_misses", "evictions", "disk_reads"))
        assert a["evictions"] > 0 and a["device_hits"] > 0


def test_float_compute_has_no_fused_step(tiny):
    with strata.load(tiny.gguf("q8_0"), threads=1, n_ctx=64, compute="float") as m:
        assert m.runner.steps is None and m.plan.decode == runtime.FLOAT


def test_native_step_refuses_bad_arguments(tiny):
    with strata.load(tiny.gguf("q8_0"), threads=1, n_ctx=64, max_batch=1, compute="packed",
                     memory="direct") as m:
        step = m.runner.steps[0]
        layer, c = step.layer, m.transformer.compute
        x = torch.zeros((1, layer.n_embd))
        cos, sin = m.transformer.rope.cos_sin(torch.tensor([0]), torch.float32)
        fresh = native.DecodeAttn.__new__(native.DecodeAttn)
        fresh.__dict__.update(layer.__dict__, _bound=None)
        with pytest.raises(ValueError, match="bind_cache"):
            fresh.run(c.pool, torch.tensor([[0]]), torch.tensor([0]), cos, sin, x, step.out, c.scratch)
        layer.bind_cache(*m.cache.layer(0))
        assert m.cache.n_blocks == 4  # 64 positions in blocks of 16
        with pytest.raises(NativeError, match="decode step of 1 sequences"):  # position past the table
            layer.run(c.pool, torch.tensor([[0, 1]]), torch.tensor([32]), cos, sin, x, step.out, c.scratch)
        with pytest.raises(NativeError):  # the new token's block past the pool
            layer.run(c.pool, torch.tensor([[0, 4]]), torch.tensor([20]), cos, sin, x, step.out, c.scratch)
        before = m.cache.k[0].clone()
        with pytest.raises(NativeError):  # an earlier block past the pool (read by attention)
            layer.run(c.pool, torch.tensor([[-1, 0]]), torch.tensor([20]), cos, sin, x, step.out, c.scratch)
        # checked before the new token's keys were written (compared as bits: blocks never taken are unwritten memory)
        assert torch.equal(m.cache.k[0].view(torch.int32), before.view(torch.int32))
        with pytest.raises(ValueError, match="int64"):
            layer.run(c.pool, torch.tensor([[0]], dtype=torch.int32), torch.tensor([0]), cos, sin, x, step.out,
                      c.scratch)
        with pytest.raises(ValueError, match="block_table"):  # one table row per sequence
            layer.run(c.pool, torch.tensor([0]), torch.tensor([0]), cos, sin, x, step.out, c.scratch)
        with pytest.raises(ValueError, match="must be"):  # caches of the wrong shape
            layer.bind_cache(torch.zeros((1, 1, 8, 3)), torch.zeros((1, 1, 8, 3)))
        with pytest.raises(NativeError):  # scratch too small
            layer.run(c.pool, torch.tensor([[0]]), torch.tensor([0]), cos, sin, x, step.out,
                      torch.zeros(8, dtype=torch.uint8))


def test_native_program_refuses_bad_arguments(tiny):
    with strata.load(tiny.gguf("q8_0"), threads=1, n_ctx=64, max_batch=1, compute="packed",
                     memory="direct") as m:
        prog = m.runner.program
        c, x = m.transformer.compute, torch.zeros((1, prog.layers[0].n_embd))
        cos, sin = m.transformer.rope.cos_sin(torch.tensor([0]), torch.float32)
        args = (c.pool, torch.tensor([[0]]), torch.tensor([0]), cos, sin)

        def run(*head, slot_of=None, **kw):
            if slot_of is not None:
                prog.fixed[0][1][:] = slot_of
            return prog.native.run(*(head or args), x, prog.routed, prog.expert_ids, prog.layer_used, c.scratch, **kw)

        for i, layer in enumerate(prog.layers):
            layer.bind_cache(*m.cache.layer(i))
        assert run() == len(prog.layers)
        with pytest.raises(NativeError, match="decode program"):  # position past the cache
            run(c.pool, torch.tensor([[0]]), torch.tensor([64]), cos, sin)
        with pytest.raises(ValueError, match="first layer"):
            run(first=len(prog.layers) + 1)
        with pytest.raises(ValueError, match="expert_ids"):
            prog.native.run(*args, x, prog.routed, prog.expert_ids[:, :, :1], prog.layer_used, c.scratch)
        with pytest.raises(NativeError, match="decode program"):  # a page table entry past the experts
            run(slot_of=torch.full_like(prog.fixed[0][1], 10 ** 6))
        with pytest.raises(ValueError, match="page table row"):
            native.DecodeLayers([(prog.layers[0], prog.fixed[0][0], torch.zeros(3, dtype=torch.int32))], prog.out)


def test_shared_expert_weights():
    """The shared expert's per-token weight: sigmoid of the gate's dot product (float rounding of
    torch's), or 1 without a gate; shapes are checked."""
    x, gate = torch.randn(5, 64), torch.randn(64)
    got = native.shared_weights(x, gate, torch.empty(5))
    assert torch.allclose(got, torch.sigmoid(x @ gate), rtol=1e-5, atol=1e-6)
    assert torch.equal(native.shared_weights(x, None, torch.empty(5)), torch.ones(5))
    with pytest.raises(ValueError, match="shared expert gate"):
        native.shared_weights(x, torch.randn(3), torch.empty(5))


# -- families with their own step features: the same checks on each one's fixture ------------------
#: gptoss: sinks, sliding windows of 8 (shorter than the prompts and decode steps), a biased router and
#:   biased clamped experts; a hand-back binds the layer's own expert function to the program's MoE call.
#: minimax: q/k norms over all heads, RoPE over 32 of 64 features, the sigmoid router's selection bias.
#: llama4: chunked local attention (chunks of 8 positions), a NoPE layer with the query temperature
#:   (floor 4), the L2 q/k norm, experts scaled at their input, dense layers between MoE ones.
#: glm4moe: partial rotary, q/k head norms, q/k/v biases, the dense first layer, the sigmoid router
#:   with its selection bias and scaling, the shared expert.
#: hyv3: q/k head norms, the dense first layer, the sigmoid router with its selection bias and scale,
#:   the shared expert.
FAMILIES = ("gptoss", "minimax", "llama4", "glm4moe", "hyv3")


@pytest.fixture(scope="module", params=FAMILIES)
def family(request):
    from tests.fixtures.tiny import zoo
    return zoo().get(request.param)


@pytest.mark.parametrize("outtype", ["q8_0", None], ids=["q8_0", "default"])
def test_family_fused_decode_and_program_equal_the_per_call_path(family, outtype):
    """Every block fused, the program over them all: the per-call path's bytes (native attention
    and routing, the fused MoE call), one sequence and three at different positions."""
    test_fused_decode_equals_the_per_call_path(family, outtype)


def test_family_program_hands_layers_to_the_memory(family):
    test_program_hands_layers_with_missing_experts_to_the_memory(family)


def test_family_program_under_evicting_memory(family):
    """Fewer slots than experts: hand-backs of MoE layers with missing experts (a dense layer run
    by the program itself): the per-block path's bytes."""
    test_program_under_evicting_memory_equals_the_per_block_path(family)


def test_family_fused_decode_under_tiered_memory_equals_direct(family):
    test_fused_decode_under_tiered_memory_equals_direct(family)


@pytest.mark.parametrize("memory", ["paged", "tiered"])
def test_family_memories_equal_direct(family, memory):
    """Packed compute on the default file: the paged and tiered memories give direct memory's
    logits and greedy tokens."""
    path, ids = family.gguf(None), family.prompt_ids(40)
    prompt = family.prompt_ids(16, seed=21)
    kw = dict(threads=1, n_ctx=128, max_batch=1, compute="packed")
    with strata.load(path, memory="direct", **kw) as direct, strata.load(path, memory=memory, **kw) as other:
        assert torch.equal(other.logits(ids), direct.logits(ids))
        assert other.generate(prompt, temperature=0, max_tokens=16, stop_token_ids=()).token_ids == \
            direct.generate(prompt, temperature=0, max_tokens=16, stop_token_ids=()).token_ids


# -- DeepSeek: latent attention and grouped routers in the fused step ------------------------------

@pytest.fixture(scope="module", params=["deepseek3", "deepseek2"])
def deepseek(request):
    from tests.fixtures.tiny import zoo
    return zoo().get(request.param)


def test_deepseek_program_and_fused_decode_agree_with_the_per_call_path(deepseek):
    """The fused step computes latent attention in C (the per-call path in torch, with the native
    decode attention): on the f32 file, one sequence and a batch of three at different positions,
    every step's logits agree within float rounding; on the default file the tokens are the same.
    The decode program (the dense first layer as a one-expert fused call) gives the fused steps'
    bytes."""
    from tests.models.helpers import rel_err
    for outtype, bound in (("f32", 1e-5), (None, None)):
        with strata.load(deepseek.gguf(outtype), threads=2, n_ctx=128, max_batch=3, compute="packed",
                         memory="direct") as m:
            assert all(s is not None for s in m.runner.steps)
            assert type(m.transformer.blocks[0].ffn).__name__ == "PackedSharedExpert"  # the dense first layer
            _has_program(deepseek, m)
            for prompts in ([deepseek.prompt_ids(7, seed=1)],
                            [deepseek.prompt_ids(5, seed=2), deepseek.prompt_ids(19, seed=3),
                             deepseek.prompt_ids(11, seed=4)]):
                per_call = _decode_logits(m, prompts, "per_call")
                fused = _decode_logits(m, prompts, "fused")
                for a, b, c in zip(fused, per_call, _decode_logits(m, prompts, "program")):
                    assert torch.equal(c, a)
                    if bound is not None:
                        assert rel_err(a, b) < bound
                    assert torch.equal(a.argmax(-1), b.argmax(-1))


def test_deepseek_program_under_evicting_memory_equals_direct(deepseek):
    """Fewer slots than experts: the program runs the dense first layer itself, hands layers with
    missing experts to the memory and reports the routing of the MoE layers it ran; the logits
    are direct memory's fused ones, byte for byte, and the memory saw every request."""
    path = deepseek.gguf(None)
    kw = dict(threads=1, n_ctx=128, max_batch=2, compute="packed", **_evicting_paged(path))
    prompts = [deepseek.prompt_ids(9, seed=11), deepseek.prompt_ids(5, seed=12)]
    with strata.load(path, threads=1, n_ctx=128, max_batch=2, compute="packed", memory="direct") as direct, \
            strata.load(path, **kw) as prog:
        _has_program(deepseek, prog)
        for a, b in zip(_decode_logits(prog, prompts), _decode_logits(direct, prompts, "fused")):
            assert torch.equal(a, b)
        t = prog.memory_stats().totals()
        assert t["evictions"] > 0 and t["device_hits"] > 0
        assert t["requests"] == t["device_hits"] + t["device_misses"] + t["device_late"]


HYBRID = ["qwen3next", "qwen35moe"]


@pytest.mark.parametrize("arch", HYBRID)
@pytest.mark.parametrize("outtype", ["q8_0", None], ids=["q8_0", "default"])
def test_fused_deltanet_and_gated_attention_equal_the_per_call_path(arch, outtype):
    """Hybrid linear attention (gated DeltaNet layers, gated full attention): every block has a
    fused step (the DeltaNet half in one native call, the gated attention in DecodeAttn), the decode
    program runs them all, and both give the per-call path's bytes, one sequence and three at
    different positions (each on its own slot's recurrent state)."""
    from tests.fixtures.tiny import zoo

    tiny = zoo().get(arch)
    with strata.load(tiny.gguf(outtype), threads=2, n_ctx=128, max_batch=3, compute="packed",
                     memory="direct") as m:
        kinds = [type(s.layer).__name__ for s in m.runner.steps]
        assert "DecodeDeltaNet" in kinds and "DecodeAttn" in kinds and all(s is not None for s in m.runner.steps)
        _has_program(tiny, m)
        assert m.runner.program.native.recurrent
        assert any(s.layer.c.q_gate for s in m.runner.steps if not s.recurrent)
        _check_fused_equals_per_call(tiny, m)


def test_native_deltanet_step_refuses_bad_arguments():
    from tests.fixtures.tiny import zoo

    with strata.load(zoo().get("qwen3next").gguf("q8_0"), threads=1, n_ctx=64, max_batch=2, compute="packed",
                     memory="direct") as m:
        i, step = next((i, s) for i, s in enumerate(m.runner.steps) if s.recurrent)
        layer, c = step.layer, m.transformer.compute
        x, pos = torch.zeros((1, layer.n_embd)), torch.tensor([3])
        from strata.models.executor.deltanet import DecodeDeltaNet

        fresh = DecodeDeltaNet.__new__(DecodeDeltaNet)
        fresh.__dict__.update(layer.__dict__, _bound=None)
        with pytest.raises(ValueError, match="bind_states"):
            fresh.run(c.pool, torch.tensor([0]), pos, x, step.out, c.scratch)
        conv, ssm = m.cache.layer(i)
        layer.bind_states(conv, ssm)
        n_slots = conv.shape[0]
        before = ssm.clone()
        with pytest.raises(NativeError, match="DeltaNet decode step of 1 sequences"):  # a slot past the states
            layer.run(c.pool, torch.tensor([n_slots]), pos, x, step.out, c.scratch)
        with pytest.raises(NativeError):
            layer.run(c.pool, torch.tensor([-1]), pos, x, step.out, c.scratch)
        step._grow(2)  # outputs and scratch for two sequences
        with pytest.raises(NativeError):  # one slot for two sequences
            layer.run(c.pool, torch.tensor([0, 0]), torch.tensor([3, 4]), torch.zeros((2, layer.n_embd)), step.out,
                      c.scratch)
        assert torch.equal(ssm, before)  # checked before any state moved
        with pytest.raises(NativeError):  # scratch too small
            layer.run(c.pool, torch.tensor([0]), pos, x, step.out, torch.zeros(8, dtype=torch.uint8))
        with pytest.raises(ValueError, match="int64"):
            layer.run(c.pool, torch.tensor([0], dtype=torch.int32), pos, x, step.out, c.scratch)
        with pytest.raises(ValueError, match="states"):  # states of another layer's shape
            layer.bind_states(torch.zeros((2, 1, 3)), ssm)
        # the decode program: the state slots are required, and checked in C
        prog = m.runner.program
        for j, lay in enumerate(prog.layers):
            lay.bind(*m.cache.layer(j))
        cos, sin = m.transformer.rope.cos_sin(pos, torch.float32)
        args = (c.pool, torch.tensor([[0]]), pos, cos, sin, x, prog.routed, prog.expert_ids, prog.layer_used, c.scratch)
        with pytest.raises(ValueError, match="state slots"):
            prog.native.run(*args)
        with pytest.raises(NativeError, match="decode program"):
            prog.native.run(*args, slots=torch.tensor([n_slots]))
        assert torch.equal(ssm, before)


# -- Llama 4: chunked local attention, NoPE layers with the query temperature, the L2 q/k norm,
# input-scaled experts, dense layers between MoE ones ----------------------------------------------

@pytest.fixture(scope="module")
def llama4():
    from tests.fixtures.tiny import zoo
    return zoo().get("llama4")


@pytest.mark.parametrize("outtype", ["q8_0", None], ids=["q8_0", "default"])
def test_llama4_fused_steps_take_its_layers_fields(llama4, outtype):
    """The fused steps (the family tests above give the per-call path's bytes through them, past
    several chunks) carry each layer's own fields: the local layers' chunk window and L2 norm,
    the global layer's temperature and no RoPE."""
    with strata.load(llama4.gguf(outtype), threads=2, n_ctx=128, max_batch=3, compute="packed",
                     memory="direct") as m:
        layers = [s.layer.c for s in m.runner.steps]
        assert [c.chunk for c in layers] == [8, 8, 8, 0] and [c.temp_floor for c in layers] == [0, 0, 0, 4]
        assert [c.qk_l2 for c in layers] == [1, 1, 1, 0] and layers[3].rope_dim == 0


def test_llama4_native_step_refuses_bad_fields(llama4):
    """The Llama 4 fields are checked: a negative chunk, an L2 flag other than 0/1, a NaN
    temperature scale, and any of them beside latent attention are errors, not reads."""
    with strata.load(llama4.gguf("q8_0"), threads=1, n_ctx=64, max_batch=1, compute="packed",
                     memory="direct") as m:
        step, c = m.runner.steps[3], m.transformer.compute  # the global layer: temperature, no RoPE
        layer = step.layer
        layer.bind_cache(*m.cache.layer(3))
        x = torch.zeros((1, layer.n_embd))
        cos, sin = m.transformer.rope.cos_sin(torch.tensor([0]), torch.float32)
        run = lambda: layer.run(c.pool, torch.tensor([[0]]), torch.tensor([0]), cos, sin, x, step.out, c.scratch)
        run()
        for field, bad in (("chunk", -1), ("qk_l2", 2), ("temp_scale", float("nan")), ("kv_lora", 16)):
            good = getattr(layer.c, field)
            setattr(layer.c, field, bad)
            with pytest.raises(NativeError):
                run()
            setattr(layer.c, field, good)
        run()
    with pytest.raises(ValueError, match="chunk"):
        native.DecodeAttn(n_embd=8, n_head=1, n_head_kv=1, head_dim=8, rope_dim=8, neox=False, norm_eps=1e-5,
                          attn_scale=1.0, attn_norm=torch.ones(8), ffn_norm=torch.ones(8),
                          qkv=("f32", torch.zeros(3 * 64 * 4, dtype=torch.uint8)),
                          o=("f32", torch.zeros(64 * 4, dtype=torch.uint8)), chunk=-1)


@pytest.mark.parametrize("key", ["qwen3moe", "qwen2moe", "qwen35moe"])
def test_a_v_of_its_own_type_keeps_the_fused_step_and_the_program(key, tmp_path):
    """llama.cpp's quantization mixes (Q4_K_M, IQ4_XS, ...) give attn_v another type than attn_q and
    attn_k: q and k stack alone, v is its own product in the fused step (its rows moved into place
    beside q|k; qkv bias, q/k norms and qwen35moe's query gates included), and the decode program
    still runs: the per-call path's bytes, one sequence and three."""
    from gguf import MODEL_TENSOR as MT

    from converters import TypePolicy, convert
    from strata.gguf import open_model
    from strata.quant import GGMLType
    from tests.fixtures.tiny import zoo

    class VOfItsOwn(TypePolicy):
        def choose(self, kind, shape, name):
            return GGMLType.F16 if kind == MT.ATTN_V else super().choose(kind, shape, name)

    tiny, path = zoo().get(key), tmp_path / f"{key}-v-f16.gguf"
    convert(tiny.hf_dir, path, VOfItsOwn.from_args(), name=f"tiny-{key}", n_threads=2)  # q8_0 attention
    with open_model(path) as mf:  # the first attention layer (qwen35moe's first ones are DeltaNet)
        layer = min(int(n.split(".")[1]) for n in mf.tensors if n.endswith(".attn_v.weight"))
        types = {n.split(".")[-2]: t.ggml_type for n, t in mf.tensors.items() if n.startswith(f"blk.{layer}.attn_")}
    assert types["attn_v"] == GGMLType.F16 and types["attn_q"] == types["attn_k"] == GGMLType.Q8_0, types
    with strata.load(path, threads=2, n_ctx=128, max_batch=3, compute="packed", memory="direct") as m:
        att = m.transformer.blocks[layer].attention
        w, hd = att.w, att.head_dim
        assert w.wv is not None and w.wv.type == GGMLType.F16 and w.wqkv is not None and w.wqkv.type == GGMLType.Q8_0
        gates = att.n_head if key == "qwen35moe" else 0  # the query's output gates, rows beside q's
        assert w.wqkv.shape[0] == (att.n_head + gates + att.n_head_kv) * hd and w.wv.shape[0] == att.n_head_kv * hd
        assert all(s is not None for s in m.runner.steps)
        _has_program(tiny, m)
        _check_fused_equals_per_call(tiny, m)


# -- Laguna: per-layer heads, the softplus output gate, sliding layers' own RoPE (the program's second table)

@pytest.fixture(scope="module", params=["laguna", "lagunam"])
def laguna(request):
    from tests.fixtures.tiny import zoo
    return zoo().get(request.param)


@pytest.mark.parametrize("outtype", ["q8_0", None], ids=["q8_0", "default"])
def test_laguna_fused_decode_and_program_equal_the_per_call_path(laguna, outtype):
    """The output gate (per head: XS.2's form, per feature: M.1's) in the fused step, 4 and 8 heads
    on different layers, and the sliding layers' RoPE of their own read from the program's second
    table, past the window of 8: the per-call path's bytes, one sequence and three."""
    with strata.load(laguna.gguf(outtype), threads=2, n_ctx=128, max_batch=3, compute="packed",
                     memory="direct") as m:
        assert all(s.layer.c.g_rows in (s.layer.c.n_head, s.layer.c.n_head * s.layer.c.head_dim)
                   for s in m.runner.steps)
        _has_program(laguna, m)
        assert [layer.reads_alt for layer in m.runner.program.layers] == [s.attention.own_rope for s in m.transformer.specs]
        _check_fused_equals_per_call(laguna, m)


def test_laguna_program_hands_layers_to_the_memory(laguna):
    test_program_hands_layers_with_missing_experts_to_the_memory(laguna)


def test_laguna_program_without_its_second_table_is_refused():
    """A program whose sliding layers read the second RoPE table refuses a call without it, and
    sizes each table by the rotary features of the layers that read it (32 full, 64 sliding):
    the full layers' table in the second place is refused."""
    from tests.fixtures.tiny import zoo
    with strata.load(zoo().get("laguna").gguf("q8_0"), threads=1, n_ctx=64, max_batch=1, compute="packed",
                     memory="direct") as m:
        prog = m.runner.program
        assert prog.alt_rope is not None and [layer.reads_alt for layer in prog.layers] == [False, True, True, True]
        x, pos = torch.zeros((1, m.transformer.blocks[0].attention.w.wo.shape[0])), torch.tensor([0])
        cos, sin = m.transformer.rope.cos_sin(pos, torch.float32)
        with pytest.raises(ValueError, match="second rope tables"):
            prog.native.run(m.transformer.compute.pool, torch.zeros((1, 1), dtype=torch.int64), pos, cos, sin, x,
                            prog.routed, prog.expert_ids, prog.layer_used, m.transformer.compute.scratch)
        assert (prog.native.rope_dim, prog.native.alt_rope_dim) == (32, 64) and cos.numel() == 16
        with pytest.raises(ValueError, match="alt rope cos must be contiguous float32 of 32 values"):
            prog.native.run(m.transformer.compute.pool, torch.zeros((1, 1), dtype=torch.int64), pos, cos, sin, x,
                            prog.routed, prog.expert_ids, prog.layer_used, m.transformer.compute.scratch, alt=(cos, sin))
