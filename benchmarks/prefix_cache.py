"""Benchmark: the prefix cache's gain and its cost.

    python benchmarks/prefix_cache.py MODEL.gguf [--threads 2] [--history 2000] [--decode-tokens 48]

1. Time to first token of a conversation's second turn: turn 1 is `--history` prompt tokens and a
   16-token reply; turn 2 is turn 1, its reply and `--turn` new tokens. With the cache the blocks
   of turn 1 (and of the reply) are not prefilled again; without it the whole of turn 2 is.
2. Decode throughput when nothing is shared: `--streams` distinct short prompts decoded together
   for `--decode-tokens` tokens, cache on against off (each run twice, alternating, best kept).

In-process through `strata.load` (token ids, greedy, stop tokens off), one model loaded per
setting; compare only inside one run. Not a unit test.
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
    """Generated tokens per second of `streams` distinct 32-token prompts decoded together."""
    prompts = [_ids(m.tokenizer.vocab_size, 32, seed=seed * 100 + i) for i in range(streams)]
    m.generate_batch(prompts, max_tokens=2, stop_token_ids=())  # admits and prefills outside the timing below
    t0 = time.perf_counter()
    done = m.generate_batch([p + [7] for p in prompts], max_tokens=n_tokens, stop_token_ids=())
    return sum(len(c.token_ids) for c in done) / (time.perf_counter() - t0)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("model")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--history", type=int, default=2000, help="tokens of turn 1 (default 2000)")
    ap.add_argument("--turn", type=int, default=48, help="new tokens of turn 2 (default 48)")
    ap.add_argument("--streams", type=int, default=4)
    ap.add_argument("--decode-tokens", type=int, default=48)
    args = ap.parse_args()
    n_ctx = args.history + args.turn + 64
    results = {}
    for on in (True, False):
        with strata.load(args.model, threads=args.threads, n_ctx=n_ctx, max_batch=args.streams,
                         prefix_cache=on) as m:
            results[on] = second_turn_ttft(m, args.history, args.turn)
            rates = [decode_rate(m, args.streams, args.decode_tokens, seed=r) for r in range(2)]
            results[on] += (max(rates),)
    (t_on, cached, r_on), (t_off, _, r_off) = results[True], results[False]
    print(f"{Path(args.model).name}: {args.threads} threads")
    print(f"second-turn TTFT ({args.history}+16+{args.turn} tokens): cached {t_on * 1000:.0f} ms "
          f"({cached} prompt tokens from the cache), not cached {t_off * 1000:.0f} ms: {t_off / t_on:.1f}x")
    print(f"decode, {args.streams} streams, nothing shared: cache on {r_on:.1f} tok/s, off {r_off:.1f} tok/s "
          f"({(r_on / r_off - 1) * 100:+.1f}%)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
