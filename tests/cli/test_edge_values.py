"""Edge values of numeric flags (0, negative, huge) are one-line refusals: exit status nonzero, one
`strata: error:` line (or argparse's usage error), never a traceback or an "internal error"."""
from __future__ import annotations

HUGE = str(10 ** 15)


def _cases(model: str, text: str) -> list[list[str]]:
    gen = ["generate", model, "-p", "hi", "--threads", "1"]
    bench = ["bench", model, "--threads", "1", "--reps", "1"]
    ppl = ["perplexity", model, "-f", text, "--threads", "1"]
    cases = []
    # a huge --top-k, --temperature or --max-step-tokens is valid (clamped to the vocabulary, flat, one step)
    for flag in ("-n", "--top-k", "--temperature", "--max-step-tokens"):
        cases.append(gen + [flag, "-1"])
    for flag in ("--ctx", "--kv-blocks", "--threads"):
        cases += [gen + [flag, "-1"], gen + [flag, HUGE]]
    cases += [gen + ["--top-p", "0"], gen + ["--top-p", "2"], gen + ["--seed", "-5"], gen + ["--ctx", "0"],
              gen + ["--prefetch-depth", "-1"]]
    cases += [bench + ["-p", "0"], bench + ["-n", "0"], bench + ["-p", "-3"], bench + ["--reps", "0"],
              bench + ["--batch", "0"], bench + ["--ctx", HUGE]]
    cases += [ppl + ["--ctx", "0"], ppl + ["--ctx", "-1"], ppl + ["--ctx", HUGE], ppl + ["-b", "0"], ppl + ["-b", "-2"]]
    cases += [["serve", model, "--port", "-1"], ["serve", model, "--port", "70000"], ["serve", model, "--max-batch", "0"],
              ["serve", model, "--max-queue", "-1"], ["serve", model, "--ctx", "0"],
              ["serve", model, "--gather-ms", "-1"], ["serve", model, "--gather-ms", HUGE]]
    cases += [["chat", model, "--temperature", "-1"], ["chat", model, "--ctx", "-1"], ["chat", model, "-n", "-1"]]
    cases += [["inspect", model, "--placement", "--ctx", "0"], ["inspect", model, "--placement", "--ctx", "-1"]]
    return cases


def test_edge_values_are_one_line_refusals(cli, qwen3, tmp_path, monkeypatch):
    monkeypatch.delenv("STRATA_DEBUG", raising=False)
    text = tmp_path / "t.txt"
    text.write_text("the expert router picks two experts. " * 20)
    bad = []
    for args in _cases(str(qwen3.gguf("f32")), str(text)):
        try:
            code, out, err = cli(*args)
        except SystemExit as e:  # argparse's own refusal (a type it cannot parse)
            code, err = e.code, ""
        lines = [x for x in err.strip().splitlines() if x.startswith("strata: error:")]
        if code == 0 or len(lines) != 1 or "internal error" in err or "Traceback" in err:
            bad.append(f"{' '.join(args[2:] if args[0] != 'serve' else args)}: exit {code}: {err.strip()[-300:]}")
    assert not bad, "\n".join(bad)
