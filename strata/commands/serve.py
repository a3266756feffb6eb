"""`strata serve MODEL`: an OpenAI-compatible HTTP server (strata.server) run by uvicorn.

Must not hold server logic: it parses arguments, builds the app and runs uvicorn. The socket is
bound and listening before anything loads or is announced (as llama-server and Ollama do): a port
in use, or any address that cannot be bound, is one line and exit status 1 with nothing loaded.
The model then loads in the background (`GET /health` is 503 until it is ready); a model that
fails to load stops the server with the error and exit status 1. With
`--expert-parallel` (under torchrun) rank 0 serves and the other ranks follow its batches
(`strata.distributed.lockstep`), opening no port; a rank lost turns open and new requests into
503s and stops the server with exit status 1 within about --ep-timeout seconds.
"""
from __future__ import annotations

import argparse
import errno
import logging
import os
import socket
import sys
from pathlib import Path

from strata.defaults import SERVE_GATHER_MS
from strata.errors import StrataArgumentError, StrataError

from .common import (add_expert_parallel_args, add_model_args, check_model_args, check_save_routing, expert_parallel,
                     follow_rank, load_kwargs, print_stats)
from .errors import os_error_text

DEFAULT_MAX_BATCH = 8
#: strata.server.tools.FAMILIES' names (that package needs the server's packages; argparse does not)
TOOL_FAMILIES = ("harmony", "deepseek", "kimi", "glm", "qwen3-coder", "mistral", "hermes", "llama3")
DEFAULT_MAX_QUEUE = 64
BACKLOG = 2048  # uvicorn's default
#: What to do about a bind failure a user can fix, by errno.
_BIND_HINTS = {errno.EADDRINUSE: "another server there? pick --port",
               errno.EACCES: "ports below 1024 need root: pick --port",
               errno.EADDRNOTAVAIL: "not an address of this machine: pick --host"}


def _check(args: argparse.Namespace) -> None:
    from strata.engine.sampling import check_int

    check_model_args(args)
    check_save_routing(args)
    check_int("--max-batch", args.max_batch, 1, 4096)
    check_int("--max-queue", args.max_queue, 0, None)
    check_int("--port", args.port, 0, 65535)
    check_int("--gather-ms", args.gather_ms, 0, 10000)
    if args.api_key is not None and not args.api_key.strip():
        raise StrataArgumentError("--api-key: expected a non-empty key")
    if not Path(args.model).is_file():
        raise StrataError(f"{args.model}: no such model file")


def run(args: argparse.Namespace) -> int:
    _check(args)
    ep = expert_parallel(args)  # None, or this rank of the group: rank 0 serves, the others follow its batches
    kwargs = load_kwargs(args)  # after this rank's --rank-memory overrides

    def loader():
        import strata

        model = strata.load(args.model, max_batch=args.max_batch, prefix_cache=not args.no_prefix_cache,
                            expert_parallel=ep, **kwargs)
        if ep is not None and ep.rank == 0:
            from strata.distributed.lockstep import lead

            try:
                lead(model, ep)
            except BaseException:
                model.close()
                raise
        return model

    try:
        if ep is not None and ep.rank != 0:
            return follow_rank(ep, loader)  # no port, no output
        return _serve(args, loader)
    finally:
        if ep is not None:
            ep.close()


def listen(host: str, port: int) -> socket.socket:
    """A TCP socket bound to host:port and listening, for uvicorn to serve on; a StrataError naming
    the address when it cannot be had (a port in use, no permission, a host that is not here)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET  # as uvicorn reads --host
    where = f"[{host}]:{port}" if family == socket.AF_INET6 else f"{host}:{port}"
    sock = socket.socket(family, socket.SOCK_STREAM)
    try:
        # as uvicorn: a port left in TIME_WAIT by a server just stopped is free; one with a listener is not
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(BACKLOG)
    except OSError as e:
        sock.close()
        hint = _BIND_HINTS.get(e.errno)
        raise StrataError(f"cannot listen on {where}: {os_error_text(e)}" + (f" ({hint})" if hint else "")) from None
    return sock


def _serve(args: argparse.Namespace, loader) -> int:
    sock = listen(args.host, args.port)  # before the model loads, or anything is said
    try:
        try:
            import uvicorn  # noqa: F401  (checked here, used by _run_server)
            from strata.server import ServerConfig, create_app  # noqa: F401
        except ImportError as e:
            raise StrataError(f"strata serve needs the server packages ({e.name} is missing): "
                              f"pip install 'strata[serve]'") from None
        return _run_server(args, loader, sock)
    finally:
        sock.close()


def _run_server(args: argparse.Namespace, loader, sock: socket.socket) -> int:
    import uvicorn
    from strata.server import ServerConfig, create_app

    name = args.alias or Path(args.model).stem
    config = ServerConfig(name, api_key=args.api_key, max_running=args.max_batch, max_queue=args.max_queue,
                          aliases=(Path(args.model).name,), tool_call_format=args.tool_call_format,
                          reasoning_format=args.reasoning_format, webui=args.webui, gather_s=args.gather_ms / 1e3)
    failed: list[BaseException] = []
    server: uvicorn.Server | None = None

    def on_load_error(e: BaseException) -> None:
        failed.append(e)
        if server is not None:
            server.should_exit = True

    app = create_app(loader, config, on_load_error, on_close=lambda model: print_stats(args, model))
    logging.basicConfig(level=logging.INFO, format="strata serve: %(message)s")
    server = uvicorn.Server(uvicorn.Config(app, host=args.host, port=args.port, log_level=args.log_level,
                                           timeout_graceful_shutdown=5, access_log=args.log_level == "debug"))
    port = sock.getsockname()[1]  # the one given, or the one --port 0 was given
    url = f"http://[{args.host}]:{port}" if ":" in args.host else f"http://{args.host}:{port}"
    page = f"; chat page at {url}/" if args.webui else ""
    print(f"strata serve: {args.model} as {name!r} on {url} (loading; GET /health answers 200 when ready{page})",
          file=sys.stderr, flush=True)
    server.run(sockets=[sock])
    if failed:
        raise failed[0] if isinstance(failed[0], (StrataError, OSError)) else StrataError(str(failed[0]))
    return 0 if server.started else 1


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("serve", help="an OpenAI-compatible HTTP server")
    add_model_args(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1", help="address to bind (default 127.0.0.1: this machine only)")
    g.add_argument("--port", type=int, default=8080, help="port (default 8080)")
    g.add_argument("--api-key", default=os.environ.get("STRATA_API_KEY") or None, metavar="KEY",
                   help="require 'Authorization: Bearer KEY' on /v1/* requests (default: $STRATA_API_KEY, "
                        "which keeps the key out of the process list)")
    g.add_argument("--alias", default=None, metavar="NAME",
                   help="model id served in /v1/models and expected in requests (default: the file's stem)")
    g.add_argument("--max-batch", type=int, default=DEFAULT_MAX_BATCH, metavar="N",
                   help=f"sequences decoded together (default {DEFAULT_MAX_BATCH})")
    g.add_argument("--max-queue", type=int, default=DEFAULT_MAX_QUEUE, metavar="N",
                   help=f"requests accepted beyond those running; more are refused with 503 (default "
                        f"{DEFAULT_MAX_QUEUE})")
    g.add_argument("--gather-ms", type=int, default=SERVE_GATHER_MS, metavar="MS",
                   help="when a request wakes an idle server, wait up to MS ms for the requests still on their way "
                        "(read, not yet tokenized) so a burst's prompts are prefilled in one step and decode in "
                        f"step (default {SERVE_GATHER_MS}; 0: start at once)")
    g.add_argument("--tool-call-format", default=None, choices=TOOL_FAMILIES, metavar="FAMILY",
                   help=f"the tool-call syntax read from replies: {', '.join(TOOL_FAMILIES)} (default: the chat "
                        "template's)")
    g.add_argument("--reasoning-format", default="auto", choices=("auto", "none"),
                   help="auto: <think> blocks and gpt-oss's analysis channel as reasoning_content; none: inline in "
                        "the content (a request's reasoning_format overrides it; default auto)")
    g.add_argument("--no-webui", dest="webui", action="store_false",
                   help="leave out the browser pages (chat at /, live expert memory at /memory); the API and "
                        "GET /api/memory stay")
    g.add_argument("--no-prefix-cache", action="store_true",
                   help="prefill every prompt whole (default: KV blocks of a prompt prefix seen before, such as a "
                        "system prompt or earlier chat turns, are shared by content hash and not prefilled again)")
    g.add_argument("--cache-ram", default="auto", metavar="SIZE",
                   help="KV room for the prefix cache beyond the running requests' (as llama-server's --cache-ram), "
                        "so prompts stay cached while others run: a size such as 2G, 0 for none, or auto: 8G, at "
                        "most an eighth of the available RAM, on the CPU (none on CUDA). Default auto")
    g.add_argument("--log-level", choices=("critical", "error", "warning", "info", "debug"), default="info",
                   help="uvicorn's log level (default info; debug also logs every request)")
    add_expert_parallel_args(p)
    p.set_defaults(func=run)
