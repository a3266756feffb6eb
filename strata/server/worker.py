"""The engine thread: the one thread that owns the `Engine` and steps it (it is not thread-safe).

Requests reach it as `Ticket`s through a thread-safe inbox; before every step it drains the
inbox (new sequences join the batch, cancelled ones leave it), then steps while anything runs
and sleeps on the inbox when nothing does. Each step's new text goes back to its request's
asyncio queue with `loop.call_soon_threadsafe`, so the HTTP side never touches the engine.
A cancel (the client disconnected) is applied before the next step: the sequence and its KV
memory are freed within one step. Admission control: at most `max_running + max_queue`
requests are open at once; more are refused with 503 before they reach the engine, as is a
sequence the engine itself refuses as full (`strata.engine.EngineFull`, where it exists).
Requests that arrive together start together: when a request wakes an idle engine, the thread
first gathers the requests still on their way (`incoming`: read, not yet submitted; and any that
come within `GATHER_QUIET_S` of the last) for at most `gather_s` (`strata serve --gather-ms`), so
a burst of prompts is prefilled in one step (each expert read once for all of them) and their
streams decode in step, rather than the first prompt's stream pausing for the others' prefill a
step later.
Expert parallelism: when the model's runner has a `tick` (rank 0's `LeadRunner`), the idle thread
calls it every `tick_s` (the ranks' heartbeat); an error marked `fatal` (a rank died or hangs)
fails every open request with 503, refuses new ones with 503 and calls `on_fatal` (the server
stops and exits non-zero).

Must not parse or format HTTP: tickets carry sequences in and `Event`s out.
"""
from __future__ import annotations

import asyncio
import contextlib
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any

import strata.engine
from strata.defaults import SERVE_GATHER_MS
from strata.engine import Sequence
from strata.errors import StrataError

from .errors import APIError
from .metrics import ServerMetrics

log = logging.getLogger("strata.server")
GATHER_QUIET_S = 0.003  # a burst has ended when nothing came for this long and none is incoming


@dataclass
class Event:
    """What the engine thread tells a request: admitted, new text, its end, or an error."""

    kind: str  # "added" | "text" | "error"
    text: str = ""
    index: int = 0  # the request's choice this event belongs to (n > 1)
    logprobs: list = field(default_factory=list)  # TokenLogprob of the tokens new in this event, when asked
    finish_reason: str | None = None  # set on the request's last event
    prompt_tokens: int = 0  # usage, on the last event
    completion_tokens: int = 0
    cached_tokens: int = 0  # prompt tokens the prefix cache served, on the last event
    timings: dict[str, Any] | None = None  # llama-server's timings of the sequence, on the last event
    error: APIError | None = None


def timings(ticket: Ticket, cached: int, generated: int) -> dict[str, Any]:
    """llama-server's `timings` of a finished sequence, measured on the engine thread: the prompt
    from the request's arrival to its first token (the queue included), the tokens after it from
    the first to the last (predicted_per_token_ms: the mean interval between generated tokens)."""
    prompt_n = len(ticket.seq.prompt_ids) - cached
    prompt_ms = (ticket.first_token - ticket.arrived) * 1e3
    predicted_ms = (ticket.last_token - ticket.first_token) * 1e3
    steps = generated - 1
    return {"cache_n": cached, "prompt_n": prompt_n, "prompt_ms": prompt_ms,
            "prompt_per_token_ms": prompt_ms / prompt_n if prompt_n else 0.0,
            "prompt_per_second": prompt_n * 1e3 / prompt_ms if prompt_ms > 0 else 0.0,
            "predicted_n": generated, "predicted_ms": predicted_ms,
            "predicted_per_token_ms": predicted_ms / steps if steps > 0 else 0.0,
            "predicted_per_second": steps * 1e3 / predicted_ms if steps > 0 and predicted_ms > 0 else 0.0}


class Ticket:
    """One sequence of a request (choice `index` of its n) and the asyncio queue its events
    arrive on (the n tickets of one request may share one queue: events carry the index)."""

    def __init__(self, seq: Sequence, loop: asyncio.AbstractEventLoop, index: int = 0,
                 events: asyncio.Queue | None = None):
        self.seq, self.loop, self.index = seq, loop, index
        self.events: asyncio.Queue[Event] = asyncio.Queue() if events is None else events
        self.arrived = time.perf_counter()
        self.first_token: float | None = None  # when its prompt was processed (engine thread)
        self.last_token: float | None = None  # when its previous token came (engine thread)
        self.n_reported = 0  # output tokens already counted (engine thread)
        self.n_logprobs = 0  # log-probability records already sent (engine thread)
        self.closed = False  # its last event was sent (engine thread)

    def send(self, event: Event) -> None:
        event.index = self.index
        try:
            self.loop.call_soon_threadsafe(self.events.put_nowait, event)
        except RuntimeError:  # the event loop has closed (server shutting down): nobody is listening
            pass


class EngineWorker:
    """Runs `model.engine` on its own thread; `submit` and `cancel` may be called from any thread."""

    def __init__(self, model: Any, metrics: ServerMetrics, max_running: int, max_queue: int, on_fatal=None,
                 gather_s: float = SERVE_GATHER_MS / 1e3):
        self.model, self.engine, self.metrics, self.on_fatal = model, model.engine, metrics, on_fatal
        self._tick = getattr(getattr(model, "runner", None), "tick", None)  # an idle heartbeat, or None
        self.broken: APIError | None = None  # set once a fatal error has ended the engine
        self.limit = max_running + max_queue
        self._inbox: queue.SimpleQueue = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._n_open = 0  # tickets submitted and not yet closed
        self._n_incoming = 0  # requests read and on their way to `submit`
        self.gather_s = gather_s
        self._active: dict[int, Ticket] = {}  # engine thread only: seq_id -> ticket
        self._stopping = False
        self._thread = threading.Thread(target=self._run, name="strata-engine", daemon=True)

    @property
    def n_open(self) -> int:
        return self._n_open

    @property
    def n_incoming(self) -> int:
        return self._n_incoming

    def start(self) -> None:
        self._thread.start()

    def stop(self, timeout: float = 30.0) -> None:
        """Abort every request and end the thread."""
        if self._thread.is_alive():
            self._inbox.put(("stop", None))
            self._thread.join(timeout)

    @contextlib.contextmanager
    def incoming(self):
        """Around a request's way from its body to its last `submit`: an idle engine waiting to
        start a burst's prompts together waits for it too (at most `gather_s`)."""
        with self._lock:
            self._n_incoming += 1
        try:
            yield
        finally:
            with self._lock:
                self._n_incoming -= 1

    def submit(self, ticket: Ticket) -> None:
        """Queue `ticket` for the engine; APIError 503 when the queue is full."""
        self.submit_all([ticket])

    def submit_all(self, tickets: list[Ticket]) -> None:
        """Queue a request's tickets (its n choices) for the engine, all or none: APIError 503 when
        they do not all fit, and then none was queued, so a refused request holds no place that the
        engine thread would have to give back before the next request comes."""
        with self._lock:
            if self.broken is not None:
                raise self.broken
            if self._n_open + len(tickets) > self.limit:
                raise APIError(503, f"the server is busy: {self._n_open} requests are running or queued, "
                                    f"{len(tickets)} more asked (at most {self.limit}); retry later", code="queue_full")
            self._n_open += len(tickets)
        for ticket in tickets:
            self._inbox.put(("add", ticket))

    def cancel(self, ticket: Ticket) -> None:
        """End the ticket's sequence before the next step (a no-op once it has finished)."""
        self._inbox.put(("cancel", ticket))

    # -- the engine thread -------------------------------------------------------------------

    def _run(self) -> None:
        try:
            while not self._stopping:
                try:
                    self._drain(block=not self.engine.busy)
                    if self.engine.busy and not self._stopping:
                        self._step()
                except Exception as e:
                    if getattr(e, "fatal", False):
                        self._fatal(e)
                        break  # a bug here must not leave every later request hanging
                    log.exception("engine thread")
                    self._fail_all(APIError(500, f"internal error: {type(e).__name__}: {e}"), drain=False)
                self._gauges()
        finally:
            self._fail_all(APIError(503, "the server is shutting down", code="shutting_down"), drain=True)

    def _drain(self, block: bool) -> None:
        """Handle what the inbox holds; with `block` (the engine is idle) first wait for something,
        then gather the requests that come with it."""
        if block:
            self._handle(*self._wait())
            self._gather()
        try:
            while True:
                self._handle(*self._inbox.get_nowait())
        except queue.Empty:
            pass

    def _wait(self) -> tuple:
        """The inbox's next item; with a heartbeat (`tick`), one each tick_s until it comes."""
        if self._tick is None:
            return self._inbox.get()
        while True:
            try:
                return self._inbox.get(timeout=self.model.runner.tick_s)
            except queue.Empty:
                self._tick()

    def _gather(self) -> None:
        """The engine was idle and a request came: take the ones coming with it (incoming, or
        arriving within GATHER_QUIET_S of the last), for at most gather_s."""
        now = time.perf_counter()
        deadline, quiet = now + self.gather_s, now + GATHER_QUIET_S
        while now < deadline and not self._stopping and (self._n_incoming or now < quiet):
            try:
                item = self._inbox.get(timeout=min(deadline, max(quiet, now + 0.001)) - now)
            except queue.Empty:
                item = None
            if item is not None:
                self._handle(*item)
                quiet = time.perf_counter() + GATHER_QUIET_S
            now = time.perf_counter()

    def _handle(self, what: str, ticket: Ticket | None) -> None:
        if what == "stop":
            self._stopping = True
        elif what == "add":
            self._add(ticket)
        elif what == "cancel" and not ticket.closed and ticket.seq.seq_id in self._active:
            self.engine.cancel(ticket.seq)
            self._close(ticket, Event("text", finish_reason="abort"))

    def _add(self, ticket: Ticket) -> None:
        full = getattr(strata.engine, "EngineFull", None)
        try:
            self.engine.add(ticket.seq)
        except Exception as e:
            if full is not None and isinstance(e, full):
                error = APIError(503, f"the server is busy: {e}; retry later", code="queue_full")
            elif isinstance(e, StrataError):  # the engine refused this sequence (the prompt is checked before)
                error = APIError(400, str(e))
            else:
                log.exception("engine.add failed")
                error = APIError(500, f"internal error: {type(e).__name__}: {e}")
            self._close(ticket, Event("error", error=error), finished=False)
            return
        self._active[ticket.seq.seq_id] = ticket
        ticket.send(Event("added"))

    def _fatal(self, e: Exception) -> None:
        """The engine cannot go on (a rank of the expert-parallel group died or hangs)."""
        log.error("%s", e)
        with self._lock:
            self.broken = APIError(503, f"the server is stopping: {e}", code="engine_failed")
        self._stopping = True
        self._fail_all(self.broken, drain=True)
        if self.on_fatal is not None:
            self.on_fatal(e)

    def _step(self) -> None:
        try:
            results = self.engine.step()
        except Exception as e:  # a failed forward pass: every sequence in it is lost, the server goes on
            if getattr(e, "fatal", False):
                raise
            if isinstance(e, StrataError):  # explained (the model file shrank under it): its one line
                log.error("engine step failed: %s", e)
                error = APIError(500, str(e), code="engine_error")
            else:
                log.exception("engine step failed")
                error = APIError(500, f"internal error in the engine: {type(e).__name__}: {e}")
            self._fail_all(error, drain=False)
            return
        now = time.perf_counter()
        for seq, text in results:
            ticket = self._active.get(seq.seq_id)
            if ticket is None or ticket.closed:
                continue
            self._timing(ticket, now)
            logprobs = self._new_logprobs(ticket)
            if seq.finished:
                self._close(ticket, Event("text", text, finish_reason=seq.finish_reason, logprobs=logprobs))
            elif text or logprobs:
                ticket.send(Event("text", text, logprobs=logprobs))

    @staticmethod
    def _new_logprobs(ticket: Ticket) -> list:
        records = ticket.seq.logprobs
        if not records or len(records) == ticket.n_logprobs:
            return []
        new = records[ticket.n_logprobs:]
        ticket.n_logprobs = len(records)
        return new

    def _timing(self, ticket: Ticket, now: float) -> None:
        seq, m = ticket.seq, self.metrics
        new = len(seq.output_ids) - ticket.n_reported
        if ticket.last_token is None:  # the first result: its prompt has been processed
            m.prompt_tokens.inc(len(seq.prompt_ids))
            m.prompt_tokens_cached.inc(getattr(seq, "n_prompt_cached", None) or 0)
            m.ttft.observe(now - ticket.arrived)
            ticket.first_token = now
        elif new > 0:
            m.itl.observe(now - ticket.last_token)
        if new > 0:
            m.generation_tokens.inc(new)
            ticket.n_reported += new
        ticket.last_token = now

    def _close(self, ticket: Ticket, event: Event, finished: bool = True) -> None:
        """The ticket's last event; it leaves the engine thread's books and the open count."""
        ticket.closed = True
        self._active.pop(ticket.seq.seq_id, None)
        event.prompt_tokens, event.completion_tokens = len(ticket.seq.prompt_ids), len(ticket.seq.output_ids)
        event.cached_tokens = getattr(ticket.seq, "n_prompt_cached", None) or 0
        if finished:
            if ticket.first_token is not None:
                event.timings = timings(ticket, event.cached_tokens, event.completion_tokens)
            self.metrics.requests_finished.labels(event.finish_reason).inc()
            self.metrics.e2e.observe(time.perf_counter() - ticket.arrived)
        with self._lock:
            self._n_open -= 1
        ticket.send(event)

    def _fail_all(self, error: APIError, drain: bool) -> None:
        """Abort every sequence in the engine with `error`; with `drain`, the inbox's too."""
        self.engine.abort()
        for ticket in list(self._active.values()):
            self._close(ticket, Event("error", error=error), finished=False)
        while drain:  # requests still in the inbox never reached the engine
            try:
                what, ticket = self._inbox.get_nowait()
            except queue.Empty:
                break
            if what == "add":
                self._close(ticket, Event("error", error=error), finished=False)

    def _gauges(self) -> None:
        running = getattr(self.engine, "running", None)
        waiting = getattr(self.engine, "waiting", None)
        n_running = len(running) if running is not None else len(self._active)
        self.metrics.requests_running.set(n_running)
        self.metrics.requests_waiting.set(len(waiting) if waiting is not None else 0)


__all__ = ["EngineWorker", "Event", "Ticket"]
