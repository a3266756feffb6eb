"""`strata chat MODEL`: an interactive chat with history; /reset clears it, /exit (or Ctrl-D) quits.
`strata chat --server URL` runs the same loop against a running `strata serve` (chat_server.py).

Must not hold engine logic: each turn is one `Model.chat` call (or one request) on the history.
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Callable

from strata.errors import StrataArgumentError, StrataError

from .common import add_model_args, add_sampling_args, check_sampling_args, load_model, print_stats

HELP = "commands: /reset clears the conversation, /exit quits"


def _reply(model, messages: list[dict]) -> str | None:
    """Stream the assistant's reply to stdout; its text, or None when it was interrupted."""
    stream = model.chat(messages, stream=True)  # the flags' SamplingParams: the model's default (load_model)
    try:
        for chunk in stream:
            sys.stdout.write(chunk.text)
            sys.stdout.flush()
    except KeyboardInterrupt:
        stream.close()
        print("\n[interrupted]")
        return None
    done = stream.completion
    used = done.prompt_tokens + len(done.token_ids)
    print(f"\n[{len(done.token_ids)} tokens, {done.tokens_per_second:.1f} tok/s, context {used}/{model.n_ctx}]",
          flush=True)
    return done.text


def run(args: argparse.Namespace) -> int:
    if args.server is not None:
        return _run_remote(args)
    if args.model is None and args.hf_repo is None:
        raise StrataArgumentError("strata chat: expected a MODEL file, -hf USER/REPO[:QUANT] or --server URL")
    with load_model(args) as model:
        if model.chat_template is None:  # a template that cannot compile ends the command here too
            raise StrataError(f"{model.path}: the file has no chat template (tokenizer.chat_template): give one "
                              "with --chat-template-file FILE.jinja, or use strata generate for plain text")
        try:
            return _loop(lambda history: _reply(model, history), args,
                         f"{model.path.name} ({model.hparams.arch}, {model.device})")
        finally:
            print_stats(args, model)


def _run_remote(args: argparse.Namespace) -> int:
    from .chat_server import ServerChat

    if args.model is not None or args.hf_repo is not None:
        raise StrataArgumentError(f"strata chat: give a MODEL file or --server URL, not both "
                                  f"({args.model or args.hf_repo})")
    check_sampling_args(args)
    server = ServerChat(args.server, args.api_key)
    return _loop(lambda history: server.reply(history, args), args, server.name)


def _loop(reply: Callable[[list[dict]], str | None], args: argparse.Namespace, name: str) -> int:
    system = [{"role": "system", "content": args.system}] if args.system else []
    history: list[dict] = list(system)
    print(f"strata chat: {name}. {HELP}", flush=True)
    while True:
        try:
            line = input("> ")
        except (EOFError, KeyboardInterrupt):
            print()
            return 0
        text = line.strip()
        if text in ("/exit", "/quit"):
            return 0
        if text == "/reset":
            history = list(system)
            print("[conversation cleared]", flush=True)
            continue
        if not text:
            continue
        if text.startswith("/"):
            print(f"[unknown command {text.split()[0]}; {HELP}]", flush=True)
            continue
        history.append({"role": "user", "content": line})
        try:
            text = reply(history)
        except StrataError as exc:
            print(f"error: {exc} (/reset starts a new conversation)", flush=True)
            text = None
        if text is None:
            history.pop()
        else:
            history.append({"role": "assistant", "content": text})


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("chat", help="chat with a model in the terminal")
    add_model_args(p)
    p.add_argument("--system", default=None, help="system prompt")
    p.add_argument("--server", default=None, metavar="URL",
                   help="chat with a running strata serve (http://127.0.0.1:8080, or 127.0.0.1:8080) instead of loading MODEL")
    p.add_argument("--api-key", default=os.environ.get("STRATA_API_KEY") or None, metavar="KEY",
                   help="the server's --api-key (with --server; default: $STRATA_API_KEY)")
    add_sampling_args(p)
    p.set_defaults(func=run)
