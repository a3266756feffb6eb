"""The HTTP app: OpenAI-style endpoints over one engine thread, health and Prometheus metrics.

    app = create_app(lambda: strata.load("model.gguf", max_batch=8), ServerConfig("model"))
    uvicorn.run(app, host="127.0.0.1", port=8080)

The model loads on a background thread when the app starts (`GET /health` answers 503 until it
is ready, 200 after); the `EngineWorker` then owns the engine. A request is parsed and checked
(`protocol`), tokenized off the event loop, handed to the engine thread as a `Ticket`, and
answered from the ticket's events (`responses`): whole, or streamed as server-sent events.
A watcher on the connection cancels the request's sequence when the client leaves. Every
error is an OpenAI-shaped body (`errors.APIError`) and touches no other request. The browser
pages and their memory JSON are `web`'s routes.

Must not step the engine (the worker does) or do model maths.
"""
from __future__ import annotations

import asyncio
import contextlib
import itertools
import logging
import secrets
import threading
import time
from dataclasses import dataclass
from typing import Any, Callable

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from starlette.concurrency import run_in_threadpool
from starlette.exceptions import HTTPException as StarletteHTTPException

from strata.defaults import SERVE_GATHER_MS
from strata.engine import Sequence
from strata.engine.sequence import stop_conditions

from .body import decode as decode_body
from .errors import APIError
from .metrics import CONTENT_TYPE, ServerMetrics
from .protocol import GenerationRequest, constrained, parse_chat, parse_completion, prompt_ids
from .responses import Events, Reply, collect, stream
from .reasoning import CLOSE, OPEN
from .tools import FAMILIES, detect
from .tools.stream import OutputStream, output_stream
from .web import add_routes as add_web_routes
from .worker import EngineWorker, Ticket

log = logging.getLogger("strata.server")
MAX_BODY_BYTES = 16 << 20


@dataclass
class ServerConfig:
    model_name: str  # the id /v1/models lists and requests name
    api_key: str | None = None  # required as 'Authorization: Bearer KEY' on /v1/* when set
    max_running: int = 4  # sequences decoded together (the model's max_batch)
    max_queue: int = 64  # requests accepted beyond those running; more get 503
    aliases: tuple[str, ...] = ()  # other names accepted for the model (e.g. the file name)
    tool_call_format: str | None = None  # the tool-call family (strata.server.tools.FAMILIES); None: the template's
    reasoning_format: str = "auto"  # "auto": reasoning as reasoning_content; "none": inline in the content
    webui: bool = True  # the chat and memory pages at / and /memory (strata.server.web)
    gather_s: float = SERVE_GATHER_MS / 1e3  # how long an idle engine waits for a burst's requests on their way


class ServerState:
    """The loaded model and its engine thread, or why there is none yet."""

    def __init__(self, loader: Callable[[], Any], config: ServerConfig,
                 on_load_error: Callable[[BaseException], None] | None = None,
                 on_close: Callable[[Any], None] | None = None):
        self.loader, self.config, self.on_load_error, self.on_close = loader, config, on_load_error, on_close
        self.metrics = ServerMetrics()
        self.model: Any = None
        self.worker: EngineWorker | None = None
        self.load_error: BaseException | None = None
        self.ids = itertools.count()
        self.created = int(time.time())
        self._lock = threading.Lock()
        self._closed = False
        self._loading = threading.Thread(target=self._load, name="strata-load", daemon=True)
        self._grammar: threading.Thread | None = None  # builds the grammar vocabulary after the load

    def start(self) -> None:
        self._loading.start()

    def _load(self) -> None:
        try:
            model = self.loader()
            try:
                model.chat_template  # compiled once here, not by racing request threads
            except Exception as e:
                log.warning("chat template unusable, /v1/chat/completions will refuse requests: %s", e)
        except BaseException as e:
            log.error("loading the model failed: %s", e)
            self.load_error = e
            if self.on_load_error is not None:
                self.on_load_error(e)
            return
        # on_fatal: the server stops (a rank of the expert-parallel group was lost)
        worker = EngineWorker(model, self.metrics, self.config.max_running, self.config.max_queue,
                              on_fatal=self.on_load_error, gather_s=self.config.gather_s)
        with self._lock:
            if self._closed:  # the server stopped while the model loaded
                model.close()
                return
            self.metrics.attach(model)
            worker.start()
            self.model, self.worker = model, worker
        log.info("model ready: %s", self.config.model_name)
        self._grammar = threading.Thread(target=self._prepare_grammar, args=(model,), name="strata-grammar",
                                         daemon=True)
        self._grammar.start()

    @staticmethod
    def _prepare_grammar(model: Any) -> None:
        """Build the grammar engine's vocabulary beside the running server (seconds on a large
        vocabulary); a constrained request that comes first waits for this build, others do not."""
        try:
            model.prepare_grammar()
        except Exception as e:  # a constrained request will meet the same error, as a 400
            log.warning("grammar vocabulary not built: %s", e)

    def ready(self) -> tuple[Any, EngineWorker]:
        if self.worker is None:
            if self.load_error is not None:
                raise APIError(503, f"the model failed to load: {self.load_error}", code="model_load_failed")
            raise APIError(503, "the model is loading; retry when GET /health answers 200", code="model_loading")
        return self.model, self.worker

    def stop(self) -> None:
        with self._lock:
            self._closed = True
            model, worker = self.model, self.worker
        if worker is not None:
            worker.stop()
        if model is not None:
            try:
                if self.on_close is not None:
                    self.on_close(model)
            finally:
                model.close()


def create_app(loader: Callable[[], Any], config: ServerConfig,
               on_load_error: Callable[[BaseException], None] | None = None,
               on_close: Callable[[Any], None] | None = None) -> FastAPI:
    """The app; `loader()` returns the `strata.Model` to serve (called once, on a thread).
    `on_load_error(exc)` hears of a failed load, or of an error that ended the engine (expert
    parallelism: a rank was lost); `on_close(model)` runs before the model closes."""
    state = ServerState(loader, config, on_load_error, on_close)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        state.start()
        try:
            yield
        finally:
            await run_in_threadpool(state.stop)

    app = FastAPI(title="strata", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.strata = state
    _add_error_handlers(app, state)
    _add_routes(app, state)
    add_web_routes(app, state, config.webui)
    return app


def _add_error_handlers(app: FastAPI, state: ServerState) -> None:
    @app.exception_handler(APIError)
    async def api_error(request: Request, exc: APIError) -> JSONResponse:
        state.metrics.requests_refused.labels(str(exc.status)).inc()
        return JSONResponse(exc.body(), status_code=exc.status)

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        message = f"{request.method} {request.url.path}: {exc.detail}"
        return await api_error(request, APIError(exc.status_code, message))

    @app.exception_handler(Exception)
    async def internal_error(request: Request, exc: Exception) -> JSONResponse:
        log.exception("internal error on %s", request.url.path)
        return await api_error(request, APIError(500, f"internal error: {type(exc).__name__}: {exc}"))


def _add_routes(app: FastAPI, state: ServerState) -> None:
    @app.get("/health")
    async def health() -> dict[str, Any]:
        state.ready()
        # open without a key: `auth` tells a client (the chat page) whether /v1/* wants one
        return {"status": "ok", "auth": state.config.api_key is not None}

    @app.get("/metrics")
    async def metrics() -> Response:
        return Response(state.metrics.render(), media_type=CONTENT_TYPE)

    @app.get("/v1/models")
    async def models(request: Request) -> dict[str, Any]:
        _authorize(request, state.config)
        model, _ = state.ready()
        return {"object": "list", "data": [_model_card(state, model)]}

    @app.get("/v1/models/{model_id:path}")
    async def model_card(model_id: str, request: Request) -> dict[str, Any]:
        _authorize(request, state.config)
        model, _ = state.ready()
        _check_model(model_id, state.config)
        return _model_card(state, model)

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request) -> Response:
        return await _generate(request, state, parse_chat)

    @app.post("/v1/completions")
    async def completions(request: Request) -> Response:
        return await _generate(request, state, parse_completion)


def _model_card(state: ServerState, model: Any) -> dict[str, Any]:
    return {"id": state.config.model_name, "object": "model", "created": state.created,
            "owned_by": "strata", "max_model_len": model.n_ctx}


def _authorize(request: Request, config: ServerConfig) -> None:
    if config.api_key is None:
        return
    scheme, _, token = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer" or not secrets.compare_digest(token.strip().encode(), config.api_key.encode()):
        raise APIError(401, "invalid or missing API key: send the header 'Authorization: Bearer KEY'",
                       code="invalid_api_key")


def _check_model(name: str | None, config: ServerConfig) -> None:
    if name is not None and name not in (config.model_name, *config.aliases):
        raise APIError(404, f"model {name!r} does not exist; this server serves {config.model_name!r}",
                       param="model", code="model_not_found")


async def _json_body(request: Request) -> Any:
    declared = request.headers.get("content-length", "")
    if declared.isdigit() and int(declared) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body has {declared} bytes; at most {MAX_BODY_BYTES} are accepted")
    body = await request.body()
    if len(body) > MAX_BODY_BYTES:
        raise APIError(413, f"the request body has {len(body)} bytes; at most {MAX_BODY_BYTES} are accepted")
    return decode_body(body)


def _sequence(state: ServerState, req: GenerationRequest, ids: list[int], model: Any, choice: int,
              family: str | None) -> Sequence:
    params = req.sampling.for_choice(choice)
    stops = stop_conditions(params, model.stop_token_ids, model.n_ctx - len(ids))
    # Text leaves out control tokens, as llama-server's does (without --special); a chat's keeps
    # those spelling the markup its tool-call family's parser and the reasoning split read.
    keep = model.tokenizer.control_ids((*FAMILIES[family].markup, OPEN, CLOSE)) if family else frozenset()
    text = model.tokenizer.stream(skip_special=True, keep=keep)
    return Sequence(next(state.ids), ids, params, stops, text, model.grammar_vocab(params))


async def _watch_disconnect(request: Request, worker: EngineWorker, tickets: list[Ticket]) -> None:
    """Cancel the tickets' sequences when the client goes away (read after the body: only
    'http.disconnect' can come)."""
    try:
        while (await request.receive())["type"] != "http.disconnect":
            pass
    except asyncio.CancelledError:  # the answer is complete: nothing to watch
        raise
    except Exception:  # the connection broke some other way: the client is gone all the same
        pass
    for ticket in tickets:
        worker.cancel(ticket)


async def _admitted(events: asyncio.Queue, n: int) -> Events:
    """Wait until the engine admits all n choices (an error: raised); events that came meanwhile are kept."""
    early, added = [], 0
    while added < n:
        event = await events.get()
        if event.kind == "error":
            raise event.error
        if event.kind == "added":
            added += 1
        else:
            early.append(event)
    return Events(events, early)


async def _generate(request: Request, state: ServerState, parse: Callable[[Any], GenerationRequest]) -> Response:
    """One request: n sequences (choice i seeded with seed + i; choices 1.. fork from choice 0's
    KV cache once its prompt is computed, so the prompt is prefilled once) sharing one event queue."""
    _authorize(request, state.config)
    model, worker = state.ready()
    req = parse(await _json_body(request))
    _check_model(req.model, state.config)
    with worker.incoming():  # an idle engine waits (briefly) for requests on their way, to start them together
        tickets = await _tickets(state, req, model)
        reply = Reply(req, state.config.model_name, model.tokenizer.token_bytes, _outputs(req, model, state.config))
        submitted: list[Ticket] = []
        watcher = asyncio.create_task(_watch_disconnect(request, worker, submitted))
        try:
            worker.submit_all(tickets)  # all or none: 503 when they do not all fit
            submitted.extend(tickets)
        except BaseException:
            for ticket in submitted:
                worker.cancel(ticket)
            watcher.cancel()
            raise
    try:
        events = await _admitted(tickets[0].events, req.n)  # admitted by the engine, or refused
        if req.stream:
            return StreamingResponse(_streaming(reply, events, req.n, submitted, worker, watcher, state),
                                     media_type="text/event-stream", headers={"Cache-Control": "no-cache"})
        return JSONResponse(reply.whole(await collect(events, req.n)))
    except BaseException:
        for ticket in submitted:
            worker.cancel(ticket)
        watcher.cancel()
        raise
    finally:
        if not req.stream:
            watcher.cancel()


async def _tickets(state: ServerState, req: GenerationRequest, model: Any) -> list[Ticket]:
    """The request's n sequences (choices 1.. forking from choice 0), as tickets sharing one event queue."""
    ids = await run_in_threadpool(prompt_ids, req, model)  # templates and long prompts off the event loop
    family = state.config.tool_call_format or detect(model.chat_template.source) if req.kind == "chat" else None
    if family:
        req.sampling = constrained(req, family)
    queue: asyncio.Queue = asyncio.Queue()
    loop = asyncio.get_running_loop()
    # off the event loop: a constrained sequence may wait for the grammar vocabulary's first build
    seqs = await run_in_threadpool(lambda: [_sequence(state, req, ids, model, i, family) for i in range(req.n)])
    seqs[1:] = [s.fork_from(seqs[0]) for s in seqs[1:]]
    return [Ticket(seq, loop, i, queue) for i, seq in enumerate(seqs)]


def _outputs(req: GenerationRequest, model: Any, config: ServerConfig) -> list[OutputStream]:
    """How each chat choice's text is read back (one stream per choice: reasoning and the template
    family's tool calls are parsed choice by choice); none for completions."""
    if req.kind != "chat":
        return []
    return [output_stream(req.tools, model.chat_template.source, req.prompt_text, config.tool_call_format,
                          req.reasoning_format or config.reasoning_format) for _ in range(req.n)]


async def _streaming(reply: Reply, events: Events, n: int, tickets: list[Ticket], worker: EngineWorker,
                     watcher: asyncio.Task, state: ServerState):
    def refused(error: APIError) -> None:
        state.metrics.requests_refused.labels(str(error.status)).inc()

    try:
        async for event in stream(reply, events, n, refused):
            yield event
    finally:  # ended, or the client left (the response task was cancelled): end the sequences
        watcher.cancel()
        for ticket in tickets:
            if not ticket.closed:
                worker.cancel(ticket)


__all__ = ["ServerConfig", "ServerState", "create_app"]
