"""The architectures with their own attention or expert forms (deepseek2: latent attention;
gpt-oss: sinks, sliding windows, biased clamped experts) against transformers' own classes, on
the same bar as the first four (tests/models/test_logits.py), plus what only they have: the
latent KV cache's size, batching, expert memory and packed compute."""
from __future__ import annotations

import pytest
import torch


import strata
from strata.models.executor import NativeRouter
from strata.models.kinds import native_classes
from strata.engine.kv_cache import KVCache
from strata.models import cache_dims
from tests.fixtures.tiny import zoo

from .helpers import REL_TOL, Bare, rel_err

NEW_KEYS = ("deepseek3", "deepseek2", "gptoss", "glm4moe", "minimax")  # deepseek2: DeepSeek-V2


@pytest.fixture(params=NEW_KEYS, scope="module")
def new(request):
    return zoo().get(request.param)


def test_expert_memory_and_packed_compute(new):
    """Tiered expert memory equals direct; packed compute (the per-call path where the fused decode
    step does not apply) equals float on the f32 file and picks the same tokens on the default file."""
    def load(path, compute, memory="direct"):
        return strata.load(path, threads=1, n_ctx=128, max_batch=1, compute=compute, memory=memory)

    ids = new.prompt_ids(40)
    with load(new.gguf("f32"), "float") as ref, load(new.gguf("f32"), "packed") as packed:
        a, b = ref.logits(ids), packed.logits(ids)
        assert rel_err(b, a) < 1e-5
        # every block decodes fused, and all of them in the decode program (DeepSeek's dense first
        # layer as a one-expert fused call)
        assert all(step is not None for step in packed.runner.steps)
        assert packed.plan.decode == "program" and packed.runner.program is not None
    path = new.gguf(None)
    with load(path, "float") as ref, load(path, "packed") as direct, load(path, "packed", "tiered") as tiered:
        assert tiered.memory.form == "packed"
        a, b = ref.logits(ids), direct.logits(ids)
        assert torch.equal(b, tiered.logits(ids))
        assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.95
        prompt = new.prompt_ids(16, seed=21)
        assert direct.generate(prompt, temperature=0, max_tokens=16, stop_token_ids=()).token_ids == \
            ref.generate(prompt, temperature=0, max_tokens=16, stop_token_ids=()).token_ids


@pytest.mark.parametrize("key", ["deepseek3", "deepseek2"])
@pytest.mark.parametrize("outtype", ["q8_0", None], ids=["q8_0", "default"])
def test_latent_attention_fused_step_equals_the_per_call_path(key, outtype):
    """Latent attention's fused step and the decode program give the per-call path's bytes (whose
    query and latent norms and RoPE are the step's native calls), one sequence and three."""
    from tests.engine.test_fused_decode import _check_fused_equals_per_call
    tiny = zoo().get(key)
    with strata.load(tiny.gguf(outtype), threads=2, n_ctx=128, max_batch=3, compute="packed",
                     memory="direct") as m:
        assert m.plan.decode == "program"
        _check_fused_equals_per_call(tiny, m)


# -- deepseek2 only --------------------------------------------------------------------------


def test_deepseek2_latent_cache_takes_the_compressed_size():
    """Per layer and position the cache holds the latent (kv_lora_rank) and the rope key
    (qk_rope_head_dim) once, not H keys and values of nope+rope / v features."""
    tiny = zoo().get("deepseek3")
    cfg = tiny.model.config
    hp = strata.gguf.open_model(tiny.gguf("f32")).hparams
    assert cache_dims(hp) == (1, cfg.kv_lora_rank + cfg.qk_rope_head_dim, 0)
    n_ctx, per_token = 64, hp.n_layers * (cfg.kv_lora_rank + cfg.qk_rope_head_dim) * 4  # float32 bytes
    cache = KVCache(hp.n_layers, 1, n_ctx, *cache_dims(hp))
    assert cache.nbytes == n_ctx * per_token == KVCache.bytes_for(hp.n_layers, 1, n_ctx, *cache_dims(hp))
    full = hp.n_layers * cfg.num_attention_heads * (cfg.qk_nope_head_dim + cfg.qk_rope_head_dim + cfg.v_head_dim) * 4
    assert per_token * 4 < full  # 96 vs 512 values per layer here


def test_deepseek2_router_matches_transformers():
    """Sigmoid scores, selection bias, group-limited top-k, renormalisation and the routed scaling
    factor: the same experts and weights as transformers' DeepseekV3TopkRouter."""
    from strata.models.moe import Router
    tiny = zoo().get("deepseek3")
    gate = tiny.model.model.layers[1].mlp.gate
    cfg = tiny.model.config
    router = Router(gate.weight.detach(), cfg.num_experts_per_tok, "sigmoid", True, cfg.routed_scaling_factor,
                    selection_bias=gate.e_score_correction_bias.detach(), n_groups=cfg.n_group,
                    n_groups_used=cfg.topk_group)
    x = torch.randn(64, cfg.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, want_w, want_ids = gate(x)
    got_w, got_ids = router(x)
    order_w, order_g = want_ids.sort(-1), got_ids.sort(-1)
    assert torch.equal(order_w.values, order_g.values)
    assert torch.allclose(want_w.gather(1, order_w.indices), got_w.gather(1, order_g.indices), atol=1e-6)


def test_deepseek_v2_router_matches_transformers():
    """Softmax scores, no selection bias, groups scored by their best expert ("group_limited_greedy"),
    no renormalisation, the routed scaling factor: as transformers' DeepseekV2TopkRouter; scoring
    groups by their top two (V3's rule, and llama.cpp's for every deepseek2 file) picks otherwise."""
    from strata.models.moe import Router
    tiny = zoo().get("deepseek2")
    gate, cfg = tiny.model.model.layers[1].mlp.gate, tiny.model.config
    x = torch.randn(256, cfg.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, want_w, want_ids = gate(x)
    order_w = want_ids.sort(-1)

    def route(score):
        return Router(gate.weight.detach(), cfg.num_experts_per_tok, "softmax", False, cfg.routed_scaling_factor,
                      n_groups=cfg.n_group, n_groups_used=cfg.topk_group, group_score=score)(x)

    got_w, got_ids = route("max")
    order_g = got_ids.sort(-1)
    assert torch.equal(order_w.values, order_g.values)
    assert torch.allclose(want_w.gather(1, order_w.indices), got_w.gather(1, order_g.indices), atol=1e-6)
    differ = (route("top2")[1].sort(-1).values != order_w.values).any(-1).float().mean()
    assert differ > 0.05  # the fixture's groups decide


def test_deepseek_v2_file_routes_by_the_best_expert_per_group():
    """A deepseek2 file without selection biases (V2) gets V2's group score; the whole model with
    V3's instead departs from transformers by far more than the tolerance."""
    tiny = zoo().get("deepseek2")
    ids = tiny.prompt_ids(40)
    ref = tiny.hf_logits(ids)
    bare = Bare(tiny.gguf("f32"))
    routers = [b.ffn.router for b in bare.model.blocks if hasattr(b.ffn, "router")]
    assert len(routers) == 2 and all(r.group_score == "max" and r.selection_bias is None for r in routers)
    assert rel_err(bare.forward(ids, 0), ref) <= REL_TOL
    other = Bare(tiny.gguf("f32"))
    for block in other.model.blocks[1:]:
        block.ffn.router.group_score = "top2"
    assert rel_err(other.forward(ids, 0), ref) > 100 * REL_TOL


def test_deepseek_v2_inspect_shows_its_hyperparameters():
    tiny = zoo().get("deepseek2")
    with strata.gguf.open_model(tiny.gguf(None)) as mf:
        hp = mf.summary()["hparams"]
    assert not hp.get("q_lora_rank") and (hp["kv_lora_rank"], hp["head_dim_mla"], hp["head_dim_v_mla"]) == (64, 64, 64)
    assert (hp["n_dense_lead"], hp["n_expert_groups"], hp["n_expert_groups_used"]) == (1, 4, 1)
    assert hp["expert_gating_func"] == "softmax" and hp["expert_weights_scale"] == 2.0
    assert not hp["expert_weights_norm"] and hp["n_shared_experts"] == 2


def test_deepseek2_inspect_shows_its_hyperparameters():
    tiny = zoo().get("deepseek3")
    with strata.gguf.open_model(tiny.gguf(None)) as mf:
        hp = mf.summary()["hparams"]
    assert (hp["q_lora_rank"], hp["kv_lora_rank"], hp["head_dim_mla"], hp["head_dim_v_mla"]) == (64, 64, 64, 64)
    assert (hp["n_dense_lead"], hp["n_expert_groups"], hp["n_expert_groups_used"]) == (1, 4, 2)
    assert hp["expert_gating_func"] == "sigmoid" and hp["expert_weights_scale"] == 2.5 and hp["expert_weights_norm"]
    assert hp["n_shared_experts"] == 1 and hp["rope_dim"] == 32
    yarn = hp["rope_scaling"]  # mscale_all_dim 1.0, written as llama.cpp's converter does (x 0.1)
    assert yarn["type"] == "yarn" and yarn["factor"] == 4.0 and abs(yarn["yarn_log_multiplier"] - 0.1) < 1e-6


def test_deepseek2_yarn_scales_attention_as_transformers_does():
    from strata.models.mla import mla_scale
    tiny = zoo().get("deepseek3")
    with strata.gguf.open_model(tiny.gguf("f32")) as mf:
        hp = mf.hparams
    attn = tiny.model.model.layers[0].self_attn
    assert abs(mla_scale(hp.head_dim_mla, hp) - attn.scaling) < 1e-6 and attn.scaling > hp.head_dim_mla ** -0.5


# -- gpt-oss only ----------------------------------------------------------------------------


def test_gpt_oss_windows_sinks_and_expert_function_are_where_transformers_has_them():
    tiny = zoo().get("gptoss")
    bare = Bare(tiny.gguf("f32"))
    cfg = tiny.model.config
    windows = [b.attention.window for b in bare.model.blocks]
    assert windows == [cfg.sliding_window if t == "sliding_attention" else 0 for t in cfg.layer_types] == [8, 0, 8, 0]
    for block, layer in zip(bare.model.blocks, tiny.model.model.layers):
        assert torch.equal(block.attention.w.sinks, layer.self_attn.sinks.detach())
        fn = block.ffn.experts.executor.expert_fn
        assert (fn.alpha, fn.limit) == (cfg.swiglu_alpha, cfg.swiglu_limit)
        assert torch.equal(fn.b_gate, layer.mlp.experts.gate_up_proj_bias.detach()[:, ::2])


def test_gpt_oss_mxfp4_experts_through_the_native_kernels(tmp_path):
    """Experts written as MXFP4 (`--experts mxfp4`) stay MXFP4 in the file; packed compute
    multiplies them from their blocks (direct and tiered memory alike) and picks the tokens the
    float path on the same file picks."""
    from converters import TypePolicy, convert
    tiny = zoo().get("gptoss")
    path = tmp_path / "gptoss-mxfp4.gguf"
    convert(tiny.hf_dir, path, TypePolicy.from_args(experts="mxfp4"), n_threads=2)
    with strata.gguf.open_model(path) as mf:
        assert {mf.tensors[f"blk.0.ffn_{p}_exps.weight"].ggml_type.name for p in ("gate", "up", "down")} == {"MXFP4"}

    def load(compute, memory="direct"):
        return strata.load(path, threads=1, n_ctx=128, max_batch=1, compute=compute, memory=memory)

    ids = tiny.prompt_ids(48)
    with load("float") as ref, load("packed") as direct, load("packed", "tiered") as tiered:
        a, b = ref.logits(ids), direct.logits(ids)
        assert torch.equal(b, tiered.logits(ids))
        assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.95
        assert rel_err(b, a) < 0.02  # activations rounded to 8 bits in the packed products


def test_gpt_oss_packed_experts_run_in_the_fused_call(monkeypatch):
    """Packed compute runs gpt-oss's clamped, biased experts in the fused native MoE call (one per
    layer and chunk of held experts), never the per-expert Python function; on the f32 file it
    equals the float path, whose experts do run that function, through every memory."""
    from strata import native
    from strata.models import expert_act
    tiny = zoo().get("gptoss")
    ids = tiny.prompt_ids(40)
    with strata.load(tiny.gguf("f32"), threads=1, n_ctx=128, max_batch=1, compute="float") as ref:
        want = ref.logits(ids)
    calls = []
    real_run = native.MoeCall._run  # whole calls and the two-call form (rows) alike

    def counted(self, *a, **k):
        calls.append(self._act is not None)
        return real_run(self, *a, **k)

    def refuse(*a, **k):
        raise AssertionError("the per-expert function ran under packed compute")

    monkeypatch.setattr(native.MoeCall, "_run", counted)
    monkeypatch.setattr(expert_act.ClampedSwiGLU, "__call__", refuse)
    for memory in ("direct", "paged", "tiered"):
        calls.clear()
        with strata.load(tiny.gguf("f32"), threads=1, n_ctx=128, max_batch=1, compute="packed", memory=memory) as m:
            got = m.logits(ids)
            n_moe = sum(s.ffn.moe for s in m.transformer.specs)
        assert rel_err(got, want) < 1e-5, memory
        assert calls and all(calls) and len(calls) >= n_moe, (memory, len(calls), n_moe)


def test_packed_decode_steps_equal_the_float_path(new, monkeypatch):
    """Packed compute decodes with native decode attention (gpt-oss: sinks and the window of 8 on
    alternate layers, in the fused step; DeepSeek: the latent rows as one kv head; MiniMax-M2:
    q/k norms over all heads and RoPE on half of each head) and the fused
    expert call: on the f32 file every decode step's logits equal the float path's (torch
    attention) within float rounding, well past the window. The torch attention runs for the
    prompts only."""
    from strata.gguf import open_model
    from strata.memory import DirectExpertMemory
    from strata.models import attention, load_model, mla
    compute, torch_decode = "float", []
    for module, name in ((attention, "attend_sinks"), (mla, "latent_attend"), (attention.Attention, "attend_decode")):
        def watched(*a, _real=getattr(module, name), **k):
            torch_decode.append((compute, next(x for x in a if hasattr(x, "is_decode")).is_decode))
            return _real(*a, **k)
        monkeypatch.setattr(module, name, watched)
    path = new.gguf("f32")
    steps = []
    for compute in ("float", "packed"):
        bare = Bare(path)
        if compute == "packed":
            bare.mf = open_model(path)
            bare.model = load_model(bare.mf, DirectExpertMemory(bare.mf), compute="packed")
            assert all(type(b.attention) in native_classes() for b in bare.model.blocks)
            if new.key == "gptoss":
                assert {b.attention.window for b in bare.model.blocks} == {0, 8}
        prompt = new.prompt_ids(12)
        logits = [bare.forward(prompt, 0, all_logits=False)[0]]
        ids = list(prompt)
        for _ in range(24):
            ids.append(int(logits[-1].argmax()) if compute == "float" else steps[0][1][len(ids)])
            logits.append(bare.forward(ids[-1:], len(ids) - 1)[0])
        steps.append((logits, ids))
    assert ("float", True) in torch_decode and ("packed", True) not in torch_decode
    (want, ids), (got, _) = steps
    for i, (a, b) in enumerate(zip(want, got)):
        assert rel_err(b, a) < 1e-5, (i, rel_err(b, a))


def test_gpt_oss_inspect_shows_its_hyperparameters():
    tiny = zoo().get("gptoss")
    with strata.gguf.open_model(tiny.gguf(None)) as mf:
        hp = mf.summary()["hparams"]
    assert hp["sliding_window"] == 8 and hp["expert_gating_func"] == "softmax_weight"
    assert hp["rope_scaling"]["type"] == "yarn" and hp["rope_scaling"]["factor"] == 32.0
    assert (hp["head_dim"], hp["n_head_kv"], hp["n_ff_exp"]) == (64, 2, 256)


# -- minimax-m2 only -------------------------------------------------------------------------


def test_minimax_m2_router_matches_transformers():
    """Sigmoid scores, the selection bias choosing but not weighing, renormalised top-k weights:
    the experts and weights of transformers' MiniMaxM2TopKRouter, through torch and the native call."""
    from strata.models.moe import Router
    tiny = zoo().get("minimax")
    block, cfg = tiny.model.model.layers[1].mlp, tiny.model.config
    x = torch.randn(64, cfg.hidden_size, generator=torch.Generator().manual_seed(3))
    with torch.no_grad():
        _, want_w, want_ids = block.gate(x, block.e_score_correction_bias)
    bias = block.e_score_correction_bias.detach()
    order_w = want_ids.sort(-1)
    for native in (False, True):
        got_w, got_ids = (NativeRouter if native else Router)(block.gate.weight.detach(), cfg.num_experts_per_tok,
                                                              "sigmoid", True, 1.0, selection_bias=bias)(x)
        order_g = got_ids.sort(-1)
        assert torch.equal(order_w.values, order_g.values), native
        assert torch.allclose(want_w.gather(1, order_w.indices), got_w.gather(1, order_g.indices), atol=1e-6)
    unbiased = Router(block.gate.weight.detach(), cfg.num_experts_per_tok, "sigmoid", True, 1.0)(x)[1].sort(-1).values
    assert (unbiased != order_w.values).any(-1).float().mean() > 0.05  # the fixture's bias decides


def test_minimax_m2_loads_its_norms_rotary_and_router_from_the_file():
    tiny = zoo().get("minimax")
    cfg = tiny.model.config
    with strata.gguf.open_model(tiny.gguf(None)) as mf:
        hp = mf.summary()["hparams"]
    assert (hp["head_dim"], hp["rope_dim"], hp["n_head_kv"]) == (64, 32, 2) and hp["expert_gating_func"] == "sigmoid"
    assert hp["expert_weights_norm"] and hp["rope_freq_base"] == 5e6 and not hp.get("n_shared_experts")
    bare = Bare(tiny.gguf("f32"))
    for block, layer in zip(bare.model.blocks, tiny.model.model.layers):
        w = block.attention.w
        assert not w.qk_norm_per_head and block.attention.rope.rope_dim == cfg.rotary_dim
        assert torch.equal(w.k_norm.weight, layer.self_attn.k_norm.weight.detach())  # [Hkv*hd]
        assert torch.equal(block.ffn.router.selection_bias, layer.mlp.e_score_correction_bias)


@pytest.mark.parametrize("key", ["deepseek3", "gptoss"])
def test_prefill_attention_in_pieces_of_queries_equals_the_whole(key, monkeypatch):
    """Prefill attention that forms its scores (latent attention's unequal widths, gpt-oss's sinks
    and window) takes a long step's queries in pieces within SCORE_ELEMENTS: with room for one
    query's scores at a time, a first chunk and a second one after it give the logits of the
    whole step within float rounding."""
    from strata.models import attention
    ids = zoo().get(key).prompt_ids(24)
    path = zoo().get(key).gguf("f32")
    whole = Bare(path)
    want = [whole.forward(ids[:14], 0), whole.forward(ids[14:], 14)]
    pieces = []
    real = attention.query_pieces

    def counted(*a, **k):
        out = real(*a, **k)
        pieces.append(len(out))
        return out
    monkeypatch.setattr(attention, "SCORE_ELEMENTS", 1)
    monkeypatch.setattr(attention, "query_pieces", counted)
    if key == "deepseek3":
        from strata.models import mla
        monkeypatch.setattr(mla, "query_pieces", counted)
    split = Bare(path)
    got = [split.forward(ids[:14], 0), split.forward(ids[14:], 14)]
    assert pieces and max(pieces) == 14  # one query per piece
    for a, b in zip(want, got):
        assert rel_err(b, a) < 1e-5
