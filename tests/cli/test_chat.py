"""`strata chat` driven through a pseudo-terminal: two turns with history, /reset, /exit."""
from __future__ import annotations

import re

import pexpect

import strata

STATS = re.compile(r"\r\n\[(\d+) tokens, [\d.]+ tok/s, context (\d+)/(\d+)\]\r\n")


SYSTEM = {"role": "system", "content": "Be brief."}
U1, U2 = {"role": "user", "content": "hello there"}, {"role": "user", "content": "and the cache?"}


def _reply(child: pexpect.spawn, text: str) -> tuple[str, int, int]:
    """Type one line; the streamed reply (terminal CRs removed), the context it used and its size."""
    child.expect_exact("> ")
    child.sendline(text)
    child.expect_exact(text + "\r\n")  # the terminal's echo of what was typed
    child.expect(STATS)
    return child.before.replace("\r", ""), int(child.match.group(2)), int(child.match.group(3))


def _exit(child: pexpect.spawn) -> None:
    child.expect_exact("> ")
    child.sendline("/exit")
    child.expect(pexpect.EOF)


def _expected(model, messages) -> tuple[str, int]:
    done = model.chat(messages, max_tokens=10, temperature=0.0)
    return done.text.replace("\r", ""), done.prompt_tokens + len(done.token_ids)


def _expected_turns(model) -> list[tuple[str, int]]:
    """What the API replies to U1 and then U2 (with U1's exchange as history)."""
    a1 = model.chat([SYSTEM, U1], max_tokens=10, temperature=0.0).text
    return [_expected(model, [SYSTEM, U1]),
            _expected(model, [SYSTEM, U1, {"role": "assistant", "content": a1}, U2])]


def test_two_turns_history_and_reset(qwen3, python, subprocess_env):
    path = qwen3.gguf("f32")
    child = pexpect.spawn(python, ["-m", "strata", "chat", str(path), "--temperature", "0", "-n", "10",
                                   "--threads", "1", "--system", "Be brief."],
                          env=subprocess_env, encoding="utf-8", timeout=60)
    try:
        first = _reply(child, "hello there")[:2]
        second = _reply(child, "and the cache?")[:2]
        child.expect_exact("> ")
        child.sendline("/reset")
        child.expect_exact("[conversation cleared]")
        after_reset = _reply(child, "and the cache?")[:2]
        _exit(child)
    finally:
        child.close(force=True)
    assert child.exitstatus == 0
    model = strata.load(path, threads=1)
    assert [first, second] == _expected_turns(model)
    assert after_reset == _expected(model, [SYSTEM, U2])
    assert second[1] > after_reset[1]  # the second turn's prompt held the first turn


def test_a_file_without_chat_template_points_to_the_template_option(cli, tmp_path):
    """`strata synth` files carry no chat template: chat says so once and names --chat-template-file,
    rather than failing each turn with advice to /reset."""
    code, _, err = cli("synth", tmp_path / "s.gguf", "--layers", "1", "--experts", "4", "--top-k", "2", "--hidden",
                       "256", "--ff", "256", "--vocab", "300", "--quiet")
    assert code == 0, err
    code, out, err = cli("chat", tmp_path / "s.gguf", "--threads", "1")
    lines = err.strip().splitlines()
    assert code == 1 and len(lines) == 1 and "/reset" not in out + err, err
    assert str(tmp_path / "s.gguf") in lines[0] and "no chat template" in lines[0]
    assert "--chat-template-file" in lines[0]
