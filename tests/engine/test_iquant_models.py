"""Models whose weights are i-quants, ternary formats and NVFP4, mixed per tensor as llama.cpp's
dynamic quantizations mix them: the packed paths (per-call, fused decode step, decode program)
run them natively and agree with the float path (dequantize, then torch); every packed path gives
the same bytes as the per-call one; a tensor of a type Strata cannot read fails at load with one
line naming the file, the tensor and its type.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import torch
from gguf.constants import GGMLQuantizationType
from gguf.quants import quant_shape_to_byte_shape

from strata import runtime
from strata.engine.kv_cache import KVCache
from strata.errors import StrataError
from strata.gguf import open_model
from strata.memory import DirectExpertMemory
from strata.models import cache_dims, load_model
from strata.quant import IQ_TYPES, GGMLType, block_size, random_blocks
from tests.gguf.fixtures import Dims, ModelWriter, _common_keys
from tests.native.qdot_cases import SCALES

T = GGMLType
D = Dims(n_layers=3, n_embd=256, n_ff_exp=256, n_experts=4, n_experts_used=2, n_head=4, n_head_kv=2, head_dim=64,
         vocab=64)
# Per layer: (attention q/k/v, attention output, expert gate, up, down): a different type in each.
LAYERS = [
    (T.IQ3_S, T.IQ4_XS, T.IQ2_XXS, T.IQ3_XXS, T.IQ4_XS),
    (T.IQ2_S, T.NVFP4, T.IQ1_M, T.TQ2_0, T.IQ4_NL),
    (T.IQ4_XS, T.IQ3_XXS, T.IQ2_XS, T.IQ1_S, T.TQ1_0),
]
EMBED, OUTPUT = T.IQ4_NL, T.IQ4_XS


def _scaled(t: GGMLType, row_len: int) -> float:
    """d giving weights of std ~0.5/sqrt(row_len) (SCALES: ~0.03 at any row length). At 1/sqrt(row_len)
    the random network is chaotic: 8-bit activation rounding alone moves its logits by ~10%."""
    return SCALES.get(t, 0.01) * 0.03 ** -1 * 0.5 / np.sqrt(row_len)


def _tensor(mw: ModelWriter, name: str, t: GGMLType, *shape: int, gain: float = 1.0) -> None:
    n_blocks = int(np.prod(shape)) // block_size(t)[0]
    data = random_blocks(t, n_blocks, mw.rng, _scaled(t, shape[-1]) * gain)
    mw.w.add_tensor(name, data.reshape(quant_shape_to_byte_shape(shape, t)), raw_dtype=t)


def write_mixed(path: Path, bad: tuple[str, GGMLType] | None = None) -> Path:
    """A qwen3moe file of LAYERS' types; `bad`: (tensor name, type) replaced with random bytes of
    that type (a type Strata does not read)."""
    mw, d = ModelWriter(path, "qwen3moe", seed=7), D
    _common_keys(mw, d)
    mw.w.add_expert_feed_forward_length(d.n_ff_exp)
    mw.w.add_key_length(d.head_dim)
    mw.w.add_value_length(d.head_dim)
    mw.w.add_vocab_size(d.vocab)
    q, kv, E, H, I = d.n_head * d.head_dim, d.n_head_kv * d.head_dim, d.n_experts, d.n_embd, d.n_ff_exp
    _tensor(mw, "token_embd.weight", EMBED, d.vocab, H, gain=np.sqrt(H))
    mw.f32("output_norm.weight", H)
    _tensor(mw, "output.weight", OUTPUT, d.vocab, H, gain=4.0)  # wide logit margins (FACTS.md)
    for i, (attn, out, gate, up, down) in enumerate(LAYERS):
        b = f"blk.{i}."
        mw.w.add_tensor(b + "attn_norm.weight", np.ones(H, np.float32))
        for name, rows in (("attn_q", q), ("attn_k", kv), ("attn_v", kv)):
            _tensor(mw, b + name + ".weight", attn, rows, H)
        _tensor(mw, b + "attn_output.weight", out, H, q)
        mw.w.add_tensor(b + "attn_q_norm.weight", np.ones(d.head_dim, np.float32))
        mw.w.add_tensor(b + "attn_k_norm.weight", np.ones(d.head_dim, np.float32))
        mw.w.add_tensor(b + "ffn_norm.weight", np.ones(H, np.float32))
        mw.f32(b + "ffn_gate_inp.weight", E, H)
        _tensor(mw, b + "ffn_gate_exps.weight", gate, E, I, H)
        _tensor(mw, b + "ffn_up_exps.weight", up, E, I, H)
        _tensor(mw, b + "ffn_down_exps.weight", down, E, H, I)
    if bad is not None:
        name, t = bad
        info = mw.w.tensors[0][name]
        shape = tuple(int(s) for s in info.shape)
        mw.w.tensors[0].pop(name)
        data = mw.rng.integers(0, 256, quant_shape_to_byte_shape(shape, t), dtype=np.uint8)
        mw.w.add_tensor(name, data, raw_dtype=t)
    return mw.finish()


@pytest.fixture(scope="module")
def mixed(tmp_path_factory) -> Path:
    return write_mixed(tmp_path_factory.mktemp("iq") / "mixed.gguf")


def test_fixture_holds_every_new_type(mixed):
    with open_model(mixed) as mf:
        types = {info.ggml_type for info in mf.tensors.values()}
    assert set(IQ_TYPES) <= types


def _load(path: Path, compute: str):
    mf = open_model(path)
    model = runtime.build(mf, DirectExpertMemory(mf, packed=compute == "packed"), compute=compute, n_threads=2)
    cache = KVCache(mf.hparams.n_layers, 3, 64, *cache_dims(mf.hparams))
    return mf, model, cache


def _close(model, mf) -> None:
    model.close()  # the packed compute pool's threads
    mf.close()


def _prefill_logits(model, cache, ids: list[int]) -> torch.Tensor:
    slot = cache.allocate()
    try:
        return model(torch.tensor(ids), cache.batch([slot], [0], [len(ids)]), cache, True)  # [T, V]
    finally:
        cache.free(slot)


def _decode(model, cache, prompts: list[list[int]], mode: str, steps: int = 6) -> list[torch.Tensor]:
    """Prefill each prompt, then `steps` batched greedy decode steps: their logits [B, V].
    mode: "program", "fused" (no program) or "per_call" (neither)."""
    model = model.with_decode({"program": runtime.PROGRAM, "fused": runtime.FUSED, "per_call": runtime.PACKED}[mode])
    slots = [cache.allocate() for _ in prompts]
    try:
        last = [int(model(torch.tensor(p), cache.batch([s], [0], [len(p)]), cache)[0].argmax())
                for s, p in zip(slots, prompts)]
        starts, out = [len(p) for p in prompts], []
        for _ in range(steps):
            logits = model(torch.tensor(last), cache.batch(slots, starts, [1] * len(slots)), cache)  # [B, V]
            out.append(logits.clone())
            last, starts = logits.argmax(-1).tolist(), [s + 1 for s in starts]
        return out
    finally:
        for s in slots:
            cache.free(s)


def test_packed_paths_agree_with_the_float_path(mixed):
    ids = np.random.default_rng(3).integers(0, D.vocab, 24).tolist()
    mf_f, ref, cache_f = _load(mixed, "float")
    mf_p, ours, cache_p = _load(mixed, "packed")
    try:
        a, b = _prefill_logits(ours, cache_p, ids), _prefill_logits(ref, cache_f, ids)
        assert torch.isfinite(b).all() and float(b.std()) > 1.0
        # Activation rounding only (8-bit blocks), through 3 layers: measured 0.026 of the logits'
        # norm; a tensor read with the wrong bytes or type moves them by 0.15 to 1.3.
        assert float((a - b).norm() / b.norm()) < 0.06
        assert float((a - b).abs().max() / b.abs().max()) < 0.08
        assert float((a.argmax(-1) == b.argmax(-1)).float().mean()) >= 0.95
        prompts = [ids[:5], ids[5:17]]
        for x, y in zip(_decode(ours, cache_p, prompts, "per_call", 3), _decode(ref, cache_f, prompts, "per_call", 3)):
            assert float((x - y).norm() / y.norm()) < 0.06
    finally:
        _close(ours, mf_p)
        _close(ref, mf_f)


def test_fused_step_and_program_give_the_per_call_bytes(mixed):
    mf, model, cache = _load(mixed, "packed")
    try:
        assert model.plan.decode == runtime.PROGRAM and all(s is not None for s in model.steps)
        rng = np.random.default_rng(4)
        prompts = [rng.integers(0, D.vocab, n).tolist() for n in (5, 11, 3)]
        per_call = _decode(model, cache, prompts, "per_call")
        for mode in ("fused", "program"):
            for x, y in zip(_decode(model, cache, prompts, mode), per_call):
                assert torch.equal(x, y), mode
    finally:
        _close(model, mf)


@pytest.mark.parametrize("bad_type", [T.Q8_1, T.Q8_K], ids=lambda t: t.name)
@pytest.mark.parametrize("tensor", ["blk.1.attn_k.weight", "blk.2.ffn_up_exps.weight"])
@pytest.mark.parametrize("compute", ["float", "packed"])
def test_unsupported_type_fails_at_load_naming_file_tensor_and_type(tmp_path, bad_type, tensor, compute):
    path = write_mixed(tmp_path / "bad.gguf", bad=(tensor, bad_type))
    mf = open_model(path)
    try:
        with pytest.raises(StrataError) as err:
            load_model(mf, DirectExpertMemory(mf, packed=compute == "packed"), compute=compute)
    finally:
        mf.close()
    _assert_names_it(str(err.value), path, tensor, bad_type)


def _assert_names_it(msg: str, path: Path, tensor: str, bad_type: GGMLType) -> None:
    assert "\n" not in msg
    assert msg.startswith(f"{path}: ") and f"'{tensor}'" in msg and f"is {bad_type.name}, a ggml type Strata cannot read" in msg
    assert "supported for dequantization: F32, F16, Q4_0" in msg and "IQ2_XXS" in msg and "NVFP4" in msg


def test_strata_load_says_it_before_anything_else(tmp_path):
    import strata

    path = write_mixed(tmp_path / "bad.gguf", bad=("blk.0.ffn_down_exps.weight", T.Q8_1))
    with pytest.raises(StrataError) as err:
        strata.load(path, threads=1, n_ctx=64)
    _assert_names_it(str(err.value), path, "blk.0.ffn_down_exps.weight", T.Q8_1)


def test_a_type_without_packed_kernels_fails_at_load_under_packed_compute(mixed, monkeypatch):
    """No type Strata dequantizes lacks packed kernels today; were one to, packed compute says which
    tensor at load (experts before anything is read, resident matrices as they are packed)."""
    from strata import native

    real = native.type_support

    def without(*types):
        def support(t):
            s = real(t)
            return s if s.type not in types else native.TypeSupport(s.type, True, False, (), None)
        return support

    for t, tensor, kind in ((T.IQ1_M, "blk.1.ffn_gate_exps.weight", "expert tensor"),
                            (T.IQ3_S, "blk.0.attn_q.weight", "tensor")):
        monkeypatch.setattr(native, "type_support", without(t))
        monkeypatch.setattr(native.support, "type_support", without(t))  # what supported_types asks
        mf = open_model(mixed)
        try:
            with pytest.raises(StrataError) as err:
                load_model(mf, DirectExpertMemory(mf, packed=True), compute="packed")
            load_model(mf, DirectExpertMemory(mf), compute="float")  # the float path still reads it
        finally:
            mf.close()
        msg = str(err.value)
        assert msg.startswith(f"{mixed}: {kind} '{tensor}' is {t.name}, which has no packed kernels "
                              f"(supported for packed compute: F32, "), msg
        listed = msg.split("packed compute: ")[1].split(")")[0].split(", ")
        assert msg.endswith("; load with compute='float'") and t.name not in listed and "Q4_K" in listed


# ---- Files llama.cpp's own quantizer writes (llama_model_quantize, no imatrix needed) ----

# ftype -> the i-quant or ternary type it gives most weights (llama.cpp mixes in Q4_K/Q6_K/F32).
LLAMA_FTYPES = {25: T.IQ4_NL, 26: T.IQ3_S, 27: T.IQ3_S, 30: T.IQ4_XS, 36: T.TQ1_0, 37: T.TQ2_0}


def _llama_quantized(tiny, ftype: int) -> Path:
    import ctypes

    llama_cpp = pytest.importorskip("llama_cpp")
    out = tiny.root / f"{tiny.key}-llama-ftype{ftype}.gguf"
    if not out.exists():
        params = llama_cpp.llama_model_quantize_default_params()
        params.ftype, params.nthread = ftype, 2
        rc = llama_cpp.llama_model_quantize(str(tiny.gguf("f32")).encode(), str(out).encode(), ctypes.byref(params))
        assert rc == 0, f"llama_model_quantize ftype {ftype}: {rc}"
    return out


@pytest.mark.interop
@pytest.mark.parametrize("ftype", list(LLAMA_FTYPES), ids=lambda f: f"ftype{f}-{LLAMA_FTYPES[f].name}")
def test_llama_cpp_quantized_files_run_packed_and_agree_with_llama_cpp(ftype):
    """IQ3_M (27) mixes IQ3_S with Q4_K per tensor, as llama.cpp's recipes do."""
    import strata
    from tests.fixtures.tiny import zoo

    llama_cpp = pytest.importorskip("llama_cpp")
    tiny = zoo().get("qwen3moe")
    path = _llama_quantized(tiny, ftype)
    with open_model(path) as mf:
        assert LLAMA_FTYPES[ftype] in {info.ggml_type for info in mf.tensors.values()}
    prompts = [tiny.prompt_ids(64, seed=s) for s in (1, 2)]
    llm = llama_cpp.Llama(model_path=str(path), n_ctx=128, n_batch=128, logits_all=True, n_threads=2, verbose=False)
    try:
        with strata.load(path, threads=2, n_ctx=128, max_batch=1, compute="packed", memory="direct") as ours:
            hits = total = 0
            for ids in prompts:
                llm.reset()
                llm.eval(ids)
                theirs = torch.from_numpy(np.array(llm.scores[:len(ids)], dtype=np.float32))
                mine = ours.logits(ids)
                # llama.cpp rounds activations as we do: measured 0.3-1.4% of the logit range
                assert float((mine - theirs).abs().max() / theirs.abs().max()) < 0.03
                hits, total = hits + int((mine.argmax(-1) == theirs.argmax(-1)).sum()), total + len(ids)
            assert hits / total >= 0.95, (hits, total)
    finally:
        llm.close()


def test_gpu_expert_memory_reads_every_type_and_refuses_one_it_cannot(mixed, monkeypatch):
    """The tiered memory on CUDA dequantizes experts with torch (strata.quant_torch): it reads
    every type of the mixed file; a type it lacked would be said at load, naming the tensor, instead
    of at the first fill."""
    import strata.models.loader as loader
    from strata.models import check_types

    with open_model(mixed) as mf:
        check_types(mf, packed=True)  # the CPU reads every tensor
        check_types(mf, packed=False, cuda=True)  # and so does the GPU dequantizer
        monkeypatch.setattr(loader, "TORCH_DEQUANT_TYPES", tuple(t for t in loader.TORCH_DEQUANT_TYPES
                                                                 if t != GGMLQuantizationType.IQ2_XXS))
        with pytest.raises(StrataError) as err:
            check_types(mf, packed=False, cuda=True)
    msg = str(err.value)
    assert msg.startswith(f"{mixed}: expert tensor 'blk.0.ffn_gate_exps.weight' is IQ2_XXS, which the GPU expert "
                          "memory cannot dequantize yet (on CUDA: F32, F16, BF16, Q4_0") and "\n" not in msg
    assert msg.endswith("run it on the CPU (device='cpu')")
