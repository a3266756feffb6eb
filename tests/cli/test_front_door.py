"""The newcomer's first commands (issue 25): --version, fast --help, `strata convert`, one sampling
rule, --server host:port, a warning for a context past the trained one, summary lines."""
from __future__ import annotations

import json
import subprocess

import pytest

from strata.cli import build_parser, version
from strata.commands.chat_server import server_url
from strata.defaults import SAMPLING_DEFAULTS
from strata.errors import StrataArgumentError

HEAVY = ("torch", "numpy", "gguf", "transformers", "cffi", "strata._native", "converters")

#: Builds the parser (as `--help` does) and prints which heavy modules got imported.
PROBE = ("import sys, runpy; sys.argv = ['strata', *{args!r}]\n"
         "try:\n    runpy.run_module('strata', run_name='__main__')\nexcept SystemExit:\n    pass\n"
         "print('HEAVY', [m for m in sys.modules if m.split('.')[0] in {heavy!r} or m in {heavy!r}])")


@pytest.mark.parametrize("args", [["--help"], ["generate", "--help"], ["convert", "--help"], ["bench", "model", "--help"],
                                  ["synth", "--help"], ["--version"]])
def test_help_imports_nothing_heavy(python, subprocess_env, args):
    code = PROBE.format(args=args, heavy=HEAVY)
    out = subprocess.run([python, "-c", code], env=subprocess_env, capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip().splitlines()[-1] == "HEAVY []"


def test_version(python, subprocess_env):
    out = subprocess.run([python, "-m", "strata", "--version"], env=subprocess_env, capture_output=True, text=True,
                         timeout=120)
    assert out.returncode == 0 and out.stdout.strip() == f"strata {version()}"
    import strata

    assert version() == strata.__version__


def test_convert_subcommand_shares_the_module_parser(capsys):
    from strata.commands.convert import build_parser as convert_parser

    mine = {a.dest: (a.default, a.choices) for a in convert_parser()._actions if a.dest != "help"}
    sub = build_parser()._subparsers._group_actions[0].choices["convert"]
    theirs = {a.dest: (a.default, a.choices) for a in sub._actions if a.dest != "help"}
    assert mine == theirs
    help_text = " ".join(sub.format_help().split())
    assert "(default q8_0)" in help_text and "(default q4_k)" in help_text


def test_convert_synth_imatrix_summary_lines(cli, tmp_path):
    from strata.synth import build_checkpoint

    hf = build_checkpoint(tmp_path / "ck", readable=True)
    code, out, err = cli("convert", hf, "-o", tmp_path / "m.gguf", "--no-progress")
    line = out.strip().splitlines()[-1]
    assert code == 0 and line.startswith(f"wrote {tmp_path / 'm.gguf'}: ") and " MiB, " in line, err
    assert "Q4_K " in line and "Q8_0 " in line and line.endswith(" s")
    code, out, err = cli("convert", hf, "-o", tmp_path / "p.gguf", "--no-progress", "--split-max-size", "200K")
    assert code == 0 and "p-00001-of-" in out and " parts, " in out, err
    code, out, _ = cli("synth", tmp_path / "s.gguf", "--layers", "2", "--experts", "8", "--top-k", "2", "--hidden",
                       "256", "--ff", "256", "--vocab", "300", "--quiet")
    assert code == 0 and out.strip().splitlines()[-1].startswith(f"wrote {tmp_path / 's.gguf'}: ")
    text = tmp_path / "t.txt"
    text.write_text("the expert router picks two experts for every token. " * 40)
    code, out, err = cli("imatrix", tmp_path / "m.gguf", "-f", text, "-o", tmp_path / "im.gguf", "--ctx", "32",
                         "--chunks", "2", "--no-progress")
    assert code == 0 and out.strip().startswith(f"wrote {tmp_path / 'im.gguf'}: ") and "F32 " in out, err


def _defaults(command: str) -> dict:
    ns = build_parser().parse_args([command, "m.gguf", "-p", "x"] if command == "generate" else [command, "m.gguf"])
    return {"temperature": ns.temperature, "top_k": ns.top_k, "top_p": ns.top_p, "min_p": ns.min_p,
            "repetition_penalty": ns.repeat_penalty, "max_tokens": ns.max_tokens}


def test_one_sampling_rule_for_every_command():
    from strata.server.protocol import parse_chat

    assert _defaults("generate") == _defaults("chat") == SAMPLING_DEFAULTS
    assert SAMPLING_DEFAULTS["temperature"] == 0.8 and SAMPLING_DEFAULTS["top_k"] == 40
    sampling = parse_chat({"model": "m", "messages": [{"role": "user", "content": "hi"}]}).sampling
    for field, value in SAMPLING_DEFAULTS.items():
        if field != "max_tokens":  # a request without max_tokens runs to the end of the context (OpenAI's)
            assert getattr(sampling, field) == value, field
    ns = build_parser().parse_args(["generate", "m.gguf", "-p", "x", "--temp", "0"])
    assert ns.temperature == 0.0  # greedy stays one flag away


@pytest.mark.parametrize("given,url", [("localhost:8080", "http://localhost:8080"),
                                       ("127.0.0.1:8080/", "http://127.0.0.1:8080"),
                                       ("https://h:1/v1", "https://h:1/v1"), ("http://h:2", "http://h:2")])
def test_server_url_takes_host_port(given, url):
    assert server_url(given) == url


def test_server_url_refuses_other_schemes():
    with pytest.raises(StrataArgumentError, match="ftp://h:1"):
        server_url("ftp://h:1")


def test_chat_server_host_port_reaches_the_server(cli, monkeypatch):
    """`chat --server 127.0.0.1:PORT` (no scheme) connects over http: a closed port is 'cannot connect',
    not urllib's 'unknown url type'."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    code, _, err = cli("chat", "--server", f"127.0.0.1:{port}")
    assert code == 1 and "cannot connect" in err and "unknown url type" not in err, err


def test_ctx_above_trained_warns_with_the_kv_size(cli, qwen3):
    path = qwen3.gguf("f32")
    from strata.gguf import open_model

    with open_model(path) as mf:
        trained = mf.hparams.context_length
    ctx = trained * 2
    code, out, err = cli("generate", path, "-p", "hi", "-n", "1", "--ctx", str(ctx), "--json", "--threads", "1")
    warning = [x for x in err.splitlines() if x.startswith("strata: warning:")]
    assert code == 0 and json.loads(out), err
    assert len(warning) == 1 and f"n_ctx={ctx}" in warning[0] and f"the {trained} positions" in warning[0]
    assert "MiB of RAM" in warning[0] or "GiB of RAM" in warning[0]
