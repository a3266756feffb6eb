"""The runtime plan (strata.runtime.plan): the decision table row by row, the plan each memory and
compute mode loads with, and that decoding under each plan gives the per-call path's bytes."""
from __future__ import annotations

import pytest
import torch

import strata
from strata import runtime
from strata.runtime import FLOAT, FUSED, PACKED, PROGRAM, ArchCaps, MemoryCaps, Target, decide

CPU_PACKED, CPU_FLOAT = Target("cpu", "packed"), Target("cpu", "float")
ALL_FUSED = ArchCaps(4, 4)


@pytest.mark.parametrize("target,memory,arch,decode,prefill,hybrid", [
    (CPU_PACKED, MemoryCaps("direct", packed=True, fixed=True), ALL_FUSED, PROGRAM, PACKED, False),
    (CPU_PACKED, MemoryCaps("paged", packed=True, fixed=True), ALL_FUSED, PROGRAM, PACKED, False),
    (CPU_PACKED, MemoryCaps("tiered", packed=True, fixed=True), ALL_FUSED, PROGRAM, PACKED, False),
    (CPU_PACKED, MemoryCaps("tiered", packed=True, prefetch_depth=2), ALL_FUSED, FUSED, PACKED, False),
    (CPU_PACKED, MemoryCaps("tiered", packed=True), ALL_FUSED, FUSED, PACKED, False),  # a loader thread moves them
    (CPU_PACKED, MemoryCaps("direct", packed=True, fixed=True), ArchCaps(4, 4, program="sliding-window rope"),
     FUSED, PACKED, False),
    (CPU_PACKED, MemoryCaps("direct", packed=True, fixed=True), ArchCaps(4, 1, "block 1 ...", "block 1 ..."),
     FUSED, PACKED, False),
    (CPU_PACKED, MemoryCaps("direct", packed=True, fixed=True), ArchCaps(4, 0, "latent attention with temperature"),
     PACKED, PACKED, False),
    (CPU_PACKED, MemoryCaps("direct"), ALL_FUSED, PACKED, PACKED, False),  # float experts beside packed matrices
    (CPU_FLOAT, MemoryCaps("direct", fixed=True), ALL_FUSED, FLOAT, FLOAT, False),
    (Target("cuda", "float"), MemoryCaps("tiered", prefetch_depth=2, hybrid=True), ArchCaps(4, 0), FLOAT, FLOAT, True),
    (CPU_PACKED, MemoryCaps("none"), ArchCaps(2, 2, program="no block has routed experts"), FUSED, PACKED, False),
])
def test_decision_table(target, memory, arch, decode, prefill, hybrid):
    plan = decide(target, memory, arch)
    assert (plan.decode, plan.prefill, plan.hybrid) == (decode, prefill, hybrid)
    assert all(why and "\n" not in why for why in (plan.decode_why, plan.prefill_why, plan.hybrid_why))
    assert plan.describe().startswith(f"decode: {decode}; prefill: {prefill}; hybrid: {'on' if hybrid else 'off'}; "
                                      f"memory: {memory.kind} — why")


def test_the_plan_says_why_the_program_cannot_take_an_architecture():
    plan = decide(CPU_PACKED, MemoryCaps("direct", packed=True, fixed=True),
                  ArchCaps(3, 3, program="block 2 has no fused decode step"))
    assert plan.decode == FUSED and "no fused decode step" in plan.decode_why


@pytest.fixture(scope="module")
def qwen3():
    from tests.fixtures.tiny import zoo
    return zoo().get("qwen3moe")


@pytest.mark.parametrize("compute,kw,decode", [
    ("packed", dict(memory="direct"), PROGRAM),
    ("packed", dict(memory="paged"), PROGRAM),
    ("packed", dict(memory="tiered", prefetch_depth=0), PROGRAM),  # served by the paged memory: experts stay put
    ("float", dict(memory="direct"), FLOAT),
], ids=["direct", "paged", "tiered-on-cpu", "float"])
def test_loaded_plans_and_their_bytes(qwen3, compute, kw, decode):
    """Each memory loads with the plan the table gives, the runner built for it holds exactly the
    fast paths it names, and its decode steps give the bytes of the model's own per-call path."""
    with strata.load(qwen3.gguf(None), threads=1, n_ctx=64, max_batch=2, compute=compute, **kw) as m:
        r = m.runner
        assert m.plan.decode == decode and m.plan.prefill == (PACKED if compute == "packed" else FLOAT)
        assert not m.plan.hybrid and (r.program is not None) == (decode == PROGRAM)
        assert (r.steps is not None) == (decode in (PROGRAM, FUSED))
        if compute == "packed":
            assert "packed" in m.plan.prefill_why
        per_call = r.with_decode(PACKED if compute == "packed" else FLOAT)
        slots, prompts = [m.cache.allocate() for _ in range(2)], [qwen3.prompt_ids(6, seed=1), qwen3.prompt_ids(9, seed=2)]
        out = {}
        try:
            for run in (r, per_call):
                last = [int(run(torch.tensor(p), m.cache.batch([s], [0], [len(p)]), m.cache)[0].argmax())
                        for s, p in zip(slots, prompts)]
                batch = m.cache.batch(slots, [len(p) for p in prompts], [1, 1])
                out[run is r] = run(torch.tensor(last), batch, m.cache)
            assert torch.equal(out[True], out[False])
        finally:
            for s in slots:
                m.cache.free(s)


def test_nothing_selects_a_path_by_attributes_on_a_built_model():
    """The models package builds maths only: no fused step, program or hybrid side is attached."""
    import inspect

    import re

    from strata.models import loader, transformer
    src = inspect.getsource(loader) + inspect.getsource(transformer)
    for attr in (".fused =", ".program =", ".hybrid =", ".native = True", "__func__", "set_packed("):
        assert attr not in src, attr
    # look-ahead hooks are given to Block and Transformer when they are made, never set afterwards
    assert not re.search(r"\b(model|block|module|b)\.\w+ = ", inspect.getsource(loader))
    assert runtime.Runner.with_decode  # tests compare runners through the runtime's own seam


def test_the_plan_names_the_memory_and_how_it_was_chosen(qwen3):
    """On the CPU with packed compute the tiered memory's options are served by the paged memory,
    and the plan (`strata inspect --placement`, `--stats`) says so; the default kind says it is one."""
    path = qwen3.gguf(None)
    with strata.load(path, threads=1, n_ctx=64, max_batch=1, memory="tiered") as m:
        assert type(m.memory).__name__ == "PagedExpertMemory" and m.plan.memory == "paged"
        assert "memory='tiered' with packed compute on the CPU" in m.plan.memory_why
        assert ("memory", "paged", m.plan.memory_why) in m.plan.rows()
        assert "; memory: paged — why: " in m.plan.describe()
    with strata.load(path, threads=1, n_ctx=64, max_batch=1) as m:  # a file just written: in the page cache
        assert m.plan.memory == "direct" and m.plan.memory_why.startswith("the file fits in RAM and is in the page cache")
    with strata.load(path, threads=1, n_ctx=64, max_batch=1, memory="paged") as m:
        assert m.plan.memory_why == "as asked" and m.plan.describe().endswith("; memory: as asked")


@pytest.mark.parametrize("arch", ["qwen3next", "qwen35moe"])
def test_hybrid_linear_attention_plans_the_program(arch):
    """Gated DeltaNet and gated attention blocks all have a fused decode step and the decode
    program takes them: with experts in place, a token is one native call."""
    from strata.runtime.runner import arch_caps
    from tests.fixtures.tiny import zoo

    with strata.load(zoo().get(arch).gguf("q8_0"), threads=1, n_ctx=64, max_batch=1, compute="packed",
                     memory="direct") as m:
        caps = arch_caps(m.transformer)
        assert caps.fused_blocks == caps.n_blocks and caps.unfused is None and caps.program is None
        assert m.plan.decode == PROGRAM and "every block fused" in m.plan.decode_why
        assert m.runner.program is not None and all(s is not None for s in m.runner.steps)


@pytest.mark.parametrize("compute,executor", [("packed", "packed"), ("float", "float")])
def test_the_plan_names_each_layers_expert_executor_and_why(compute, executor):
    """The plan's experts row (shown by --stats and inspect --placement through `describe`) names the
    executor the loader built for the MoE layers, and the reason; a model whose layers cannot all use
    hybrid compute says so in the hybrid row."""
    from strata.models.spec import CLAMPED, SWIGLU, AttentionSpec, FfnSpec, LayerSpec
    from strata.runtime.plan import experts_row, hybrid_row
    from tests.fixtures.tiny import zoo

    with strata.load(zoo().get("qwen3moe").gguf("q8_0"), threads=1, n_ctx=64, max_batch=1, compute=compute) as m:
        assert m.plan.experts == executor
        assert f"; experts: {executor}, {m.plan.experts_why}; memory: " in m.plan.describe()
        assert ("experts", executor, m.plan.experts_why) in m.plan.rows()
        forms = {b.ffn.experts.executor.form for b, s in zip(m.transformer.blocks, m.transformer.specs) if s.ffn.moe}
        assert forms == {"packed" if executor == "packed" else "float"}
    layer = lambda i, act: LayerSpec(i, 1e-6, AttentionSpec("gqa"), FfnSpec("moe", 8, 2, act=act))
    cuda, hybrid = Target("cuda", "float"), MemoryCaps("tiered", hybrid=True)
    on, why = hybrid_row(cuda, hybrid, [layer(0, SWIGLU), layer(1, CLAMPED)])
    assert on and "1 of 2 MoE layers" in why
    on, why = hybrid_row(cuda, hybrid, [layer(0, CLAMPED)])
    assert not on and "no CPU side" in why
    kinds, why = experts_row(cuda, hybrid, [layer(0, SWIGLU), layer(1, CLAMPED)])
    assert kinds == "hybrid (1 layer), float (1 layer)" and "hybrid:" in why and "float:" in why
