"""Benchmark: the prefix cache's gain and its cost.

    python benchmarks/prefix_cache.py MODEL.gguf [--threads 2] [--history 2000] [--decode-tokens 48]

1. Time to first token of a conversation's second turn: turn 1 is `--history` prompt tokens and a
   16-token reply; turn 2 is turn 1, its reply and `--turn` new tokens. With the cache the blocks
   of turn 1 (and of the reply) are not prefilled again; without it the whole of turn 2 is.
2. Throughput when nothing is shared: `--streams` new short prompts (none seen before) decoded
   together for `--decode-tokens` tokens, prefill included, cache on against off (`--reps` runs
   each, alternating, best kept).

In-process through `strata.load` (token ids, stop tokens off), both settings loaded at once;
compare only inside one run. Not a unit test.
"""
from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

import strata  # noqa: E402


def _ids(vocab: int, n: int, seed: int) -> list[int]:
    rng = random.Random(seed)
    return [rng.randrange(vocab) for _ in range(n)]


def second_turn_ttft(m, history: int, turn: int) -> tuple[float, int]:
    """Seconds to the first token of turn 2 (turn 1 run before it), and its cached prompt tokens."""
    V = m.tokenizer.vocab_size
    turn1 = _ids(V, history, seed=1)
    reply = m.generate(turn1, max_tokens=16, stop_token_ids=()).token_ids
    turn2 = m.generate(turn1 + reply + _ids(V, turn, seed=2), max_tokens=1, stop_token_ids=())
    return turn2.prefill_seconds, turn2.cached_tokens


def decode_rate(m, streams: int, n_tokens: int, seed: int) -> float:
    """Generated tokens per second (prefill included) of `streams` 32-token prompts no request
    sent before decoded together: the cache hashes and registers their blocks and finds nothing."""
    prompts = [_ids(m.tokenizer.vocab_size, 32, seed=seed * 100 + i) for i in range(streams)]
    t0 = time.perf_counter()
    done = m.generate_batch(prompts, max_tokens=n_tokens, stop_token_ids=())
    return sum(len(c.token_ids) for c in done) / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--history", type=int, default=2000, help="tokens of turn 1 (default 2000)")
    ap.add_argument("--turn", type=int, default=48, help="new tokens of turn 2 (default 48)")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--decode-tokens", type=int, default=48)
    ap.add_argument("--reps", type=int, default=4, help="decode runs per setting, alternating (best kept)")
    args = ap.parse_args()
    n_ctx = args.history + args.turn + 64
    settings = dict(threads=args.threads, n_ctx=n_ctx, max_batch=args.streams)
    with strata.load(args.model, **settings) as on, strata.load(args.model, **settings, prefix_cache=False) as off:
        (t_on, cached), (t_off, _) = (second_turn_ttft(m, args.history, args.turn) for m in (on, off))
        decode_rate(on, args.streams, 4, seed=999), decode_rate(off, args.streams, 4, seed=998)  # warm-up
        rates: dict[bool, list[float]] = {True: [], False: []}
        for r in range(args.reps):  # alternating, so drift in the machine's load hits both alike
            for cache, m in ((True, on), (False, off))[::1 if r % 2 == 0 else -1]:
                rates[cache].append(decode_rate(m, args.streams, args.decode_tokens, seed=2 * r + cache))
    r_on, r_off = max(rates[True]), max(rates[False])
    print(f"{Path(args.model).name}: {args.threads} threads")
    print(f"second-turn TTFT ({args.history}+16+{args.turn} tokens): cached {t_on * 1000:.0f} ms "
          f"({cached} prompt tokens from the cache), not cached {t_off * 1000:.0f} ms: {t_off / t_on:.1f}x")
    print(f"decode, {args.streams} streams of new prompts, nothing shared: cache on {r_on:.2f} tok/s, off "
          f"{r_off:.2f} tok/s ({(r_on / r_off - 1) * 100:+.1f}%); runs on {[round(r, 2) for r in rates[True]]}, "
          f"off {[round(r, 2) for r in rates[False]]}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
