"""Where the routing traces are: the project's shared folder (`shared/traces/`) sits beside the
checkout (`../shared/traces/`) or beside one of its parents; `STRATA_TRACE` names a trace file or
a folder of traces (CI's `.ci/run` exports it when `../shared/traces/` is there)."""
from __future__ import annotations

import os
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]  # the checkout


def trace_dirs(root: Path = ROOT) -> list[Path]:
    """Folders to look in, first match wins: $STRATA_TRACE (a folder, or a file's folder), then
    shared/traces beside the checkout and beside each of its parents."""
    env = os.environ.get("STRATA_TRACE")
    first = [] if not env else [Path(env) if Path(env).is_dir() else Path(env).parent]
    return first + [p / "shared" / "traces" for p in root.parents]


def find_trace(name: str, root: Path = ROOT) -> Path | None:
    """The trace file `name` (`$STRATA_TRACE` itself when it is a file of that name), or None."""
    env = os.environ.get("STRATA_TRACE")
    if env and Path(env).is_file() and Path(env).name == name:
        return Path(env)
    return next((d / name for d in trace_dirs(root) if (d / name).is_file()), None)


__all__ = ["find_trace", "preset_trace_shape", "record_preset_trace", "record_trace", "trace_dirs"]


def preset_trace_shape(preset: str, n_layers: int = 4, seed: int = 0):
    """A tiny synthetic file with `preset`'s expert count, top-k and routing recipe (skewed
    routers, correlated layers; `strata.synth.gguf_file`), at hidden and expert width 256: a few
    MB per layer, decoded in seconds. The presets' own scaling keeps at least 2 layers and far
    wider rows, too slow for tests."""
    from strata.synth.gguf_file import ROUTER_SKEW, Shape
    from strata.synth.presets import PRESETS

    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r} (expected one of {', '.join(PRESETS)})")
    p = PRESETS[preset]
    return Shape(p.arch, n_layers, p.n_experts, p.top_k, hidden=256, ff=256, n_head=2, n_head_kv=1, vocab=512,
                 weight_scale=0.3, skew=ROUTER_SKEW, seed=seed)


def record_trace(model_path: str | os.PathLike, tokens: int, seed: int = 0, threads: int = 2):
    """indices int16 [L, T, K] of a text of `tokens` random token ids, as the model's routers chose
    them (read in one prefill: a causal model routes a text the same way token by token). Random
    weights sample a near-constant token, whose decode would route every step alike."""
    import numpy as np

    import strata
    from strata.memory.stats import TraceRecorder

    rows: dict[int, list] = {}  # model layer -> its steps' expert ids
    with strata.load(model_path, threads=threads, n_ctx=tokens + 16, memory="direct", prefix_cache=False) as m:
        observe = m.memory.observe

        def record(layer, ids):
            rows.setdefault(layer, []).append(ids.detach().cpu().numpy())
            return observe(layer, ids)

        m.memory.observe = record
        text = np.random.default_rng(seed).integers(0, m.transformer.vocab_size, tokens).tolist()
        m.generate(text, max_tokens=1, temperature=0, stop_token_ids=())
    recorder = TraceRecorder(len(rows))
    for li, layer in enumerate(sorted(rows)):
        for ids in rows[layer]:
            recorder.add(li, ids)
    return recorder.indices()[:, :tokens]  # the text; not the routing of the one token sampled


def record_preset_trace(preset: str, tokens: int, path: str | os.PathLike, n_layers: int = 4,
                        seed: int = 0) -> Path:
    """Write `preset_trace_shape(preset)` to a temporary file, decode `tokens` tokens from it and
    save their routing at `path` (`indices` [L, T, K], the shared/traces format)."""
    import tempfile

    import numpy as np

    from strata.synth.gguf_file import write

    with tempfile.TemporaryDirectory() as tmp:
        gguf = Path(tmp) / f"{preset}.gguf"
        write(gguf, preset_trace_shape(preset, n_layers, seed), drop_cache=False)
        indices = record_trace(gguf, tokens, seed)
    np.savez(path, indices=indices, layers=np.arange(indices.shape[0]))
    return Path(path)
