"""Child process of test_truncated_file.py and tests/server/test_truncated_model.py: runs a `strata`
command (or, with `--serve`, a served request through the app) on PATH, and cuts PATH to half its
size at one moment of a running model.

    python truncate_while_running.py PATH generate ARGS...     # `strata generate ARGS...`; exit: its status
    python truncate_while_running.py PATH --serve ARGS...      # strata.load(PATH, ARGS as key=value): JSON out

The moment: the first time the model's file is checked (`ModelFile.check_intact`) after a step has
produced a token, right after that check passes. With the decode program (direct memory) that is
before it reads the experts in place from the map, the race that used to end in SIGBUS; the paged
and tiered memories check after each step, so their next step's reads find the file cut short.
Deterministic: no timing is involved. Prints "TRUNCATED <new size>" on stderr when it cuts.
"""
from __future__ import annotations

import json
import os
import sys

from strata.engine import engine
from strata.gguf import model as gguf_model

path, mode, args = sys.argv[1], sys.argv[2], sys.argv[3:]
state = {"armed": False, "cut": False}
real_check, real_step = gguf_model.ModelFile.check_intact, engine.Engine.step


def check_then_cut(self) -> None:
    real_check(self)
    if state["armed"] and not state["cut"]:
        state["cut"] = True
        os.truncate(path, os.path.getsize(path) // 2)
        print("TRUNCATED", os.path.getsize(path), file=sys.stderr, flush=True)


def step_then_arm(self):
    results = real_step(self)
    state["armed"] = state["armed"] or any(seq.output_ids for seq, _ in results)
    return results


gguf_model.ModelFile.check_intact = check_then_cut
engine.Engine.step = step_then_arm


def serve(options: list[str]) -> dict:
    """A request cut short by the truncation, then /health and another request, through the app
    (`strata serve`'s, in process): what each answered."""
    from fastapi.testclient import TestClient

    import strata
    from strata.server import ServerConfig, create_app

    kw = dict(option.split("=", 1) for option in options)
    kw = {k: int(v) if v.isdigit() else v for k, v in kw.items()}
    app = create_app(lambda: strata.load(path, **kw), ServerConfig("tiny"))
    body = {"model": "tiny", "prompt": "Hello world, this is a test", "max_tokens": 30, "temperature": 0,
            "ignore_eos": True}
    out = {}
    with TestClient(app) as client:
        while client.get("/health").status_code != 200:
            pass
        with client.stream("POST", "/v1/completions", json={**body, "stream": True}) as r:
            out["stream_status"] = r.status_code
            out["stream"] = [line for line in r.iter_lines() if line]
        out["health"] = client.get("/health").status_code
        r = client.post("/v1/completions", json=body)
        out["after"] = [r.status_code, r.json()]
        out["health_after"] = client.get("/health").status_code
    return out


if mode == "--serve":
    print(json.dumps(serve(args)), flush=True)
else:
    from strata.cli import main

    sys.exit(main([mode, *args]))
