"""Benchmark: `strata serve` under 1, 4 and 8 concurrent clients, alone or against llama.cpp's
`llama-server` on the same file with the same threads.

    python benchmarks/serve_concurrency.py MODEL.gguf [--clients 1 4 8] [--max-tokens 48] [--rounds 2]
        [--threads 2] [--prompt-words 100] [--no-repeat] [--llama-server [PATH]] [--trials N]
        [-- any further strata serve option, e.g. --device cuda]

For each server (Strata, then llama-server when `--llama-server` is given) one process is started
(`--max-batch` / `-np` = the largest client count, the same `--threads`, the same context per
sequence), waited for on /health and warmed up. Then for each client count, that many threads
each send `--rounds` streaming completions one after another (greedy, `ignore_eos`, so every
request generates exactly --max-tokens): first "fresh" prompts the server has never seen (each
starts with its own tag, so no two share more than a token or two), then, unless --no-repeat,
the very same prompts again ("repeated": what a prompt cache serves; llama-server's is on by
default, as is Strata's prefix cache). Per row: total generated tokens / wall time, the median
time to first token, and the median over requests of the token interval: the server's own
`timings.predicted_per_token_ms` (llama-server's, which Strata reports the same way: the span from
the first generated token to the last over the tokens after the first), else a request's time
from its first text to its last event over its tokens less one (`one_request` says why not the
gaps between text events, which are kept as text_event_gap_median_s). `--llama-server` alone uses (and, the
first time, builds with benchmarks/build_llama_server.sh) .ci-cache/llama-server-build; a PATH
names a binary. `--trials N` (with --llama-server) keeps both servers up and lets them take turns
N times per row (which one goes first alternates, each trial with new prompts), then compares the
medians over the trials: on a host whose speed drifts by a third within minutes, back-to-back
turns see the same drift. A last table gives Strata / llama-server per row (> 1: Strata faster for tok/s,
< 1: Strata faster for times). Same machine, one run: compare only inside it.
Standard library only. Not a unit test.
"""
from __future__ import annotations

import argparse
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.error
import urllib.request
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from benchmarks.llama_amx import deny_amx  # noqa: E402
LLAMA_SERVER = ROOT / ".ci-cache" / "llama-server-build" / "bin" / "llama-server"
WORDS = ("the weather over the northern hills turned cold and every traveller on the old road looked for "
         "shelter in the villages where bread and soup were shared by the fire").split()


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_ready(url: str, proc: subprocess.Popen, timeout: float, name: str) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise SystemExit(f"{name} exited with status {proc.returncode}")
        try:
            with urllib.request.urlopen(url + "/health", timeout=5) as r:
                if r.status == 200:
                    return
        except (urllib.error.URLError, OSError):
            pass
        time.sleep(0.2)
    raise SystemExit(f"{name} not ready after {timeout} s")


def strata_command(args: argparse.Namespace, port: int) -> list[str]:
    return [sys.executable, "-m", "strata", "serve", args.model, "--port", str(port), "--threads", str(args.threads),
            "--ctx", str(args.ctx), "--max-batch", str(max(args.clients)), "--log-level", "warning", *args.strata_extra]


def llama_command(args: argparse.Namespace, port: int, binary: str) -> list[str]:
    """Its defaults otherwise (prompt cache, repacking, mmap); -c is shared by the -np slots."""
    slots = max(args.clients)
    return [binary, "-m", args.model, "--port", str(port), "-t", str(args.threads), "-tb", str(args.threads),
            "-c", str(args.ctx * slots), "-np", str(slots), "--no-webui"]


def llama_server_binary(given: str) -> str:
    """The binary named, or the one benchmarks/build_llama_server.sh builds (once) and prints."""
    if given != "build":
        return given
    if LLAMA_SERVER.exists():
        return str(LLAMA_SERVER)
    print("building llama-server (once; benchmarks/build_llama_server.sh) ...", file=sys.stderr)
    done = subprocess.run([str(ROOT / "benchmarks" / "build_llama_server.sh")], check=True, capture_output=True,
                          text=True)
    return done.stdout.strip().splitlines()[-1]


@contextlib.contextmanager
def running(name: str, command: list[str], port: int, timeout: float):
    """The server started, ready and warmed up; its URL. Stopped on the way out."""
    env = dict(os.environ, PYTHONPATH=os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")]))
    log = tempfile.NamedTemporaryFile("w", prefix=f"{name}-", suffix=".log", delete=False)
    # llama-server as on a CPU without AMX where its AMX kernel crashes (benchmarks/llama_amx.py)
    preexec = deny_amx if name == "llama-server" else None
    proc = subprocess.Popen(command, env=env, stdout=log, stderr=subprocess.STDOUT, preexec_fn=preexec)
    url = f"http://127.0.0.1:{port}"
    try:
        wait_ready(url, proc, timeout, name)
        one_request(url, "warm up", 8)
        yield url
    finally:
        proc.terminate()
        proc.wait(60)
        log.close()
        print(f"{name} log: {log.name}", file=sys.stderr)


def one_request(url: str, prompt: str, max_tokens: int) -> dict:
    """One streamed completion: tokens generated, time to first text, gaps between text events,
    and the token interval: (last event - first text) / (tokens - 1). The token count is the
    usage's where the server sends one, else the number of text events. Text events are not
    tokens: a token whose text is a control token or part of a UTF-8 character may send none (and
    llama-server sends none for control tokens, Strata spells them), so the gaps between events
    compare servers badly on a synthetic vocabulary. The interval is the server's own figure where
    it reports one (timings.predicted_per_token_ms, llama-server's and Strata's: decode alone, no
    streaming), else measured here (the streaming counted in)."""
    body = {"prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True, "ignore_eos": True,
            "stream_options": {"include_usage": True}}
    request = urllib.request.Request(url + "/v1/completions", data=json.dumps(body).encode(),
                                     headers={"Content-Type": "application/json"})
    t0, times, tokens, end, reported = time.perf_counter(), [], None, None, None
    try:
        response = urllib.request.urlopen(request, timeout=3600)
    except urllib.error.HTTPError as exc:  # say what the server refused
        raise SystemExit(f"serve_concurrency: {url} answered {exc.code}: {exc.read().decode(errors='replace')}") from None
    with response:
        for raw in response:
            line = raw.decode("utf-8").strip()
            if not line.startswith("data: ") or line == "data: [DONE]":
                continue
            event, end = json.loads(line[6:]), time.perf_counter()
            if event.get("choices") and event["choices"][0].get("text"):
                times.append(end)
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
            if (event.get("timings") or {}).get("predicted_per_token_ms") is not None:
                reported = event["timings"]["predicted_per_token_ms"] / 1000
    gaps = [b - a for a, b in zip(times, times[1:])]
    tokens = len(times) if tokens is None else tokens
    interval = reported if reported is not None else (end - times[0]) / (tokens - 1) if times and tokens > 1 else None
    return {"tokens": tokens, "ttft": times[0] - t0 if times else None, "gaps": gaps, "interval": interval}


def prompts_for(tag: str, n: int, words: int) -> list[str]:
    """n prompts of about `words` words, each led by its own tag so fresh prompts share no prefix."""
    return [f"Request {tag}.{i}: " + " ".join(WORDS[(i + k) % len(WORDS)] for k in range(words)) for i in range(n)]


def run_clients(url: str, n_clients: int, rounds: int, max_tokens: int, prompts: list[str]) -> dict:
    def client(i: int) -> list[dict]:
        return [one_request(url, prompts[i * rounds + r], max_tokens) for r in range(rounds)]

    t0 = time.perf_counter()
    with ThreadPoolExecutor(n_clients) as pool:
        results = [r for rs in pool.map(client, range(n_clients)) for r in rs]
    wall = time.perf_counter() - t0
    tokens = sum(r["tokens"] for r in results)
    gaps = [g for r in results for g in r["gaps"]]
    intervals = [r["interval"] for r in results if r["interval"] is not None]
    return {"clients": n_clients, "requests": len(results), "generated_tokens": tokens, "wall_s": round(wall, 3),
            "tokens_per_s": round(tokens / wall, 2),
            "ttft_median_s": round(statistics.median(r["ttft"] for r in results if r["ttft"] is not None), 4),
            "inter_token_median_s": round(statistics.median(intervals), 5) if intervals else None,
            "text_event_gap_median_s": round(statistics.median(gaps), 5) if gaps else None}


def bench_rows(name: str, url: str, args: argparse.Namespace, n: int, tag: str, **extra) -> list[dict]:
    """One client count: fresh prompts (tagged `tag`), then (unless --no-repeat) the same prompts again."""
    rows = []
    prompts = prompts_for(tag, n * args.rounds, args.prompt_words)
    for kind in ["fresh"] if args.no_repeat else ["fresh", "repeated"]:
        row = {"server": name, "prompts": kind, **extra, **run_clients(url, n, args.rounds, args.max_tokens, prompts)}
        print(json.dumps(row), flush=True)
        rows.append(row)
    return rows


def bench(name: str, url: str, args: argparse.Namespace) -> list[dict]:
    """Every client count, one server."""
    return [row for n in args.clients for row in bench_rows(name, url, args, n, f"{n}")]


def bench_trials(urls: dict[str, str], args: argparse.Namespace) -> list[dict]:
    """--trials: both servers up at once; for each client count, `trials` rounds of the rows, the
    servers taking turns (which goes first alternates), each trial with prompts of its own. A noisy
    host then moves both servers' figures alike; the medians over trials are compared."""
    rows, names = [], list(urls)
    for n in args.clients:
        for t in range(args.trials):
            for name in names if t % 2 == 0 else names[::-1]:
                rows += bench_rows(name, urls[name], args, n, f"{n}.{t}", trial=t)
    return rows


def medians(rows: list[dict]) -> list[dict]:
    """Per server and row, the median over trials of each figure (trials kept as a count)."""
    groups: dict[tuple, list[dict]] = {}
    for r in rows:
        groups.setdefault((r["server"], r["clients"], r["prompts"]), []).append(r)
    out = []
    for (server, clients, prompts), rs in groups.items():
        row = {"server": server, "prompts": prompts, "clients": clients, "trials": len(rs)}
        for k in ("tokens_per_s", "ttft_median_s", "inter_token_median_s", "text_event_gap_median_s"):
            values = [r[k] for r in rs if r[k] is not None]
            row[k] = round(statistics.median(values), 5) if values else None
        print(json.dumps({"median_over_trials": True, **row}), flush=True)
        out.append(row)
    return out


def ratios(rows: list[dict]) -> None:
    """Strata / llama-server for each (clients, prompts) both ran."""
    llama = {(r["clients"], r["prompts"]): r for r in rows if r["server"] == "llama-server"}
    for r in rows:
        other = llama.get((r["clients"], r["prompts"])) if r["server"] == "strata" else None
        if other is None:
            continue
        ratio = {k: round(r[k] / other[k], 2) if r[k] and other[k] else None
                 for k in ("tokens_per_s", "ttft_median_s", "inter_token_median_s")}
        print(json.dumps({"strata_over_llama_server": True, "clients": r["clients"], "prompts": r["prompts"], **ratio}))


def parse_args() -> argparse.Namespace:
    argv = sys.argv[1:]
    extra = argv[argv.index("--") + 1:] if "--" in argv else []
    argv = argv[:argv.index("--")] if "--" in argv else argv
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("model")
    p.add_argument("--clients", type=int, nargs="+", default=[1, 4, 8])
    p.add_argument("--max-tokens", type=int, default=48)
    p.add_argument("--rounds", type=int, default=2, help="requests per client, one after another")
    p.add_argument("--threads", type=int, default=2, help="CPU threads of each server")
    p.add_argument("--ctx", type=int, default=512, help="context positions per sequence")
    p.add_argument("--prompt-words", type=int, default=100, help="words per prompt (~1.3 tokens each)")
    p.add_argument("--no-repeat", action="store_true", help="fresh prompts only")
    p.add_argument("--llama-server", nargs="?", const="build", default=None, metavar="PATH",
                   help="also run llama-server (PATH, or built into .ci-cache/llama-server-build)")
    p.add_argument("--trials", type=int, default=1,
                   help="with --llama-server: run both servers at once, take turns TRIALS times per row and "
                        "compare the medians (for a noisy host)")
    p.add_argument("--ready-timeout", type=float, default=600)
    args = p.parse_args(argv)
    args.strata_extra = extra
    return args


def main() -> int:
    args = parse_args()
    servers = [("strata", lambda port: strata_command(args, port))]
    if args.llama_server is not None:
        binary = llama_server_binary(args.llama_server)
        servers.append(("llama-server", lambda port: llama_command(args, port, binary)))
    rows = []
    if args.trials > 1:
        if len(servers) < 2:
            raise SystemExit("serve_concurrency: --trials compares two servers: give --llama-server too")
        with contextlib.ExitStack() as stack:
            urls = {}
            for name, command in servers:
                port = free_port()
                urls[name] = stack.enter_context(running(name, command(port), port, args.ready_timeout))
            rows = medians(bench_trials(urls, args))
    else:
        for name, command in servers:
            port = free_port()
            with running(name, command(port), port, args.ready_timeout) as url:
                rows += bench(name, url, args)
    ratios(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
