"""Child process of the fuzz tests: runs cases from a JSON-lines file, one result line each.

    python -m tests.fuzz.runner CASES.jsonl START MEMORY_BYTES

Each case is {"path": FILE, "commands": [...]} with commands among "open" (strata.gguf.open_model),
"inspect", "generate" and "chat" (the `strata` CLI, in this process). `generate` and `inspect`
run only when the file opens. STRATA_DEBUG=1 is set, so an error the CLI could only catch with its
last-resort handler raises here instead and is reported as a traceback. Output: one JSON line
per command, {"case": i, "command": c, "verdict": "ok" | "error" | "traceback" | "bad-error",
"detail": ...}, flushed at once so the parent sees how far a crashed or stuck child got.
"""
from __future__ import annotations

import contextlib
import io
import json
import os
import resource
import sys
import traceback

GENERATE = ["-p", "Hello world", "-n", "3", "--threads", "1", "--ctx", "64"]
CHAT_INPUT = "hello there\n/exit\n"


def _cli(argv: list[str], stdin: str = "") -> tuple[str, str]:
    from strata.cli import main

    out, err = io.StringIO(), io.StringIO()
    old_stdin = sys.stdin
    sys.stdin = io.StringIO(stdin)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            code = main(argv)
    except SystemExit as e:  # argparse
        code = e.code
    except BaseException:
        return "traceback", traceback.format_exc()[-1500:]
    finally:
        sys.stdin = old_stdin
    text = err.getvalue()
    lines = [line for line in text.splitlines() if line.startswith("strata: error:")]
    if "Traceback" in text or "Traceback" in out.getvalue():
        return "traceback", text[-1500:]
    if code == 0:
        return "ok", ""
    if code == 1 and len(lines) == 1:
        return "error", lines[0][:300]
    return "bad-error", f"exit {code}: {text[-600:]}"


def _open(path: str) -> tuple[str, str]:
    from strata.errors import StrataError
    from strata.gguf import open_model

    try:
        open_model(path).close()
        return "ok", ""
    except StrataError as e:
        return "error", str(e)[:300]
    except BaseException:
        return "traceback", traceback.format_exc()[-1500:]


def run_case(case: dict) -> list[tuple[str, str, str]]:
    path, results = case["path"], []
    opened = None
    for command in case["commands"]:
        if command == "open":
            verdict, detail = _open(path)
            opened = verdict == "ok"
        elif command in ("inspect", "generate") and opened is False:
            continue
        elif command == "inspect":
            verdict, detail = _cli(["inspect", path])
        elif command == "generate":
            memory = ["--memory", case.get("memory", "tiered")]
            verdict, detail = _cli(["generate", path, *GENERATE, *memory])
        elif command == "chat":
            verdict, detail = _cli(["chat", path, "-n", "3", "--threads", "1", "--ctx", "64"], CHAT_INPUT)
        else:
            raise ValueError(f"unknown fuzz command {command!r}")
        results.append((command, verdict, detail))
    return results


def main() -> None:
    cases_file, start, memory = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    resource.setrlimit(resource.RLIMIT_AS, (memory, memory))
    os.environ["STRATA_DEBUG"] = "1"
    import torch

    torch.set_num_threads(1)
    with open(cases_file) as f:
        cases = [json.loads(line) for line in f]
    print(json.dumps({"ready": True}), flush=True)
    for i in range(start, len(cases)):
        for command, verdict, detail in run_case(cases[i]):
            print(json.dumps({"case": i, "command": command, "verdict": verdict, "detail": detail}), flush=True)
        print(json.dumps({"done": i}), flush=True)


if __name__ == "__main__":
    main()
