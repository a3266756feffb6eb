"""The engine thread with a scripted engine (no model): events in order, a cancel lands before the
next step, the engine's own refusals (EngineFull, a StrataError) and a failed step answer only
the requests they concern, admission control counts open requests, and a burst of requests that
wakes an idle engine starts in one step."""
from __future__ import annotations

import asyncio
import threading
import time
from collections import deque

import pytest

import strata.engine
from strata.engine import SamplingParams, Sequence, StopConditions
from strata.errors import StrataError
from strata.server import APIError, ServerMetrics
from strata.server.worker import EngineWorker, Ticket


class Letters:
    def push(self, token_id: int) -> str:
        return chr(ord("a") + token_id % 26)

    def flush(self) -> str:
        return ""


class ScriptedEngine:
    """Engine's public interface; every step appends token len(output) to each running sequence.
    `gate`, when set, must be released once per step (so a test can act between steps)."""

    def __init__(self):
        self.waiting: deque[Sequence] = deque()
        self.running: list[Sequence] = []
        self.steps: list[list[int]] = []  # seq ids stepped, per step
        self.gate: threading.Semaphore | None = None
        self.full = False
        self.fail_next = False
        self.delay = 0.0  # seconds each step takes

    @property
    def busy(self) -> bool:
        return bool(self.waiting or self.running)

    def add(self, seq: Sequence) -> None:
        if self.full:
            raise strata.engine.EngineFull("the waiting queue holds 0 sequences at most")
        if len(seq.prompt_ids) > 8:
            raise StrataError(f"prompt of {len(seq.prompt_ids)} tokens does not fit")
        self.waiting.append(seq)

    def step(self):
        if self.gate is not None:
            assert self.gate.acquire(timeout=10)
        if self.fail_next:
            self.fail_next = False
            raise RuntimeError("forward failed")
        time.sleep(self.delay)
        self.running += list(self.waiting)
        self.waiting.clear()
        self.steps.append([s.seq_id for s in self.running])
        out = []
        for seq in list(self.running):
            out.append((seq, seq.append(len(seq.output_ids))))
            if seq.finished:
                self.running.remove(seq)
        return out

    def cancel(self, seq: Sequence) -> None:
        for group in (self.waiting, self.running):
            if seq in group:
                group.remove(seq)
        seq.finish_reason = seq.finish_reason or "abort"

    def abort(self) -> None:
        for seq in [*self.waiting, *self.running]:
            seq.finish_reason = seq.finish_reason or "abort"
        self.waiting.clear()
        self.running.clear()


class FakeModel:
    def __init__(self):
        self.engine = ScriptedEngine()

    def memory_stats(self):
        return None


def seq(i: int, n_prompt: int = 2, max_tokens: int = 3) -> Sequence:
    return Sequence(i, list(range(n_prompt)), SamplingParams(), StopConditions(max_tokens=max_tokens), Letters())


async def events(ticket: Ticket) -> list[tuple]:
    out = []
    while True:
        e = await asyncio.wait_for(ticket.events.get(), 10)
        out.append((e.kind, e.text, e.finish_reason, e.error.status if e.error else None))
        if e.kind == "error" or e.finish_reason is not None:
            return out


@pytest.fixture
def engine_full(monkeypatch):
    class EngineFull(StrataError):
        pass
    monkeypatch.setattr(strata.engine, "EngineFull", EngineFull, raising=False)


def run_worker(body, max_queue: int = 8, gather_s: float = 0.05):
    model = FakeModel()
    worker = EngineWorker(model, ServerMetrics(), max_running=2, max_queue=max_queue, gather_s=gather_s)
    worker.start()
    try:
        return asyncio.run(body(worker, model.engine))
    finally:
        worker.stop()


def test_events_in_order_and_usage():
    async def body(worker, engine):
        loop = asyncio.get_running_loop()
        a, b = Ticket(seq(0, max_tokens=3), loop), Ticket(seq(1, max_tokens=2), loop)
        worker.submit(a)
        worker.submit(b)
        got = await asyncio.gather(events(a), events(b))
        assert a.closed and b.closed and worker.n_open == 0
        return got

    ea, eb = run_worker(body)
    assert ea == [("added", "", None, None), ("text", "a", None, None), ("text", "b", None, None),
                  ("text", "c", "length", None)]
    assert eb == [("added", "", None, None), ("text", "a", None, None), ("text", "b", "length", None)]


def test_cancel_lands_before_the_next_step():
    async def body(worker, engine):
        engine.gate = threading.Semaphore(0)
        loop = asyncio.get_running_loop()
        t = Ticket(seq(0, max_tokens=100), loop)
        worker.submit(t)
        assert (await t.events.get()).kind == "added"
        engine.gate.release()  # step 1
        assert (await t.events.get()).text == "a"
        worker.cancel(t)  # while the worker waits inside step 2
        engine.gate.release()  # step 2 (already begun) ends; the cancel is applied before step 3
        rest = await events(t)
        for _ in range(3):
            engine.gate.release()
        return rest

    rest = run_worker(body)
    assert rest[-1][2] == "abort" and len(rest) <= 2


def test_refusals_touch_only_their_request(engine_full):
    async def body(worker, engine):
        loop = asyncio.get_running_loop()
        long = Ticket(seq(0, n_prompt=20), loop)
        worker.submit(long)
        assert (await events(long))[-1] == ("error", "", None, 400)
        engine.full = True
        refused = Ticket(seq(1), loop)
        worker.submit(refused)
        assert (await events(refused))[-1] == ("error", "", None, 503)
        engine.full = False
        engine.fail_next = True
        failed = Ticket(seq(2), loop)
        worker.submit(failed)
        assert (await events(failed))[-1] == ("error", "", None, 500)
        ok = Ticket(seq(3), loop)
        worker.submit(ok)
        assert (await events(ok))[-1] == ("text", "c", "length", None)
        assert worker.n_open == 0

    run_worker(body)


def test_admission_counts_open_requests():
    async def body(worker, engine):
        engine.gate = threading.Semaphore(0)
        loop = asyncio.get_running_loop()
        tickets = [Ticket(seq(i), loop) for i in range(3)]  # limit: 2 running + 1 queued
        for t in tickets:
            worker.submit(t)
        with pytest.raises(APIError) as info:
            worker.submit(Ticket(seq(9), loop))
        assert info.value.status == 503 and info.value.code == "queue_full"
        for _ in range(20):
            engine.gate.release()
        for t in tickets:
            await events(t)
        worker.submit(Ticket(seq(10), loop))  # room again
        for _ in range(5):
            engine.gate.release()

    run_worker(body, max_queue=1)


def test_a_request_is_admitted_whole_or_not_at_all():
    """A request of n choices that does not fit takes no place at all: the next request that fits is
    admitted at once, without waiting for the engine thread to give places back."""
    async def body(worker, engine):
        engine.gate = threading.Semaphore(0)
        loop = asyncio.get_running_loop()
        first = Ticket(seq(0), loop)
        worker.submit(first)
        with pytest.raises(APIError) as info:   # limit 2: 1 open, 2 more asked
            worker.submit_all([Ticket(seq(1), loop), Ticket(seq(2), loop)])
        assert info.value.status == 503 and info.value.code == "queue_full"
        assert worker.n_open == 1
        second = Ticket(seq(3), loop)
        worker.submit_all([second])
        for _ in range(20):
            engine.gate.release()
        for t in (first, second):
            assert (await events(t))[-1][0] != "error"
        assert worker.n_open == 0

    run_worker(body, max_queue=0)


def _submit_later(worker: EngineWorker, ticket: Ticket, after: float) -> threading.Thread:
    """`ticket` on its way (incoming) for `after` seconds, then submitted: a request being tokenized."""
    ready = threading.Event()

    def run():
        with worker.incoming():
            ready.set()
            time.sleep(after)
            worker.submit(ticket)

    thread = threading.Thread(target=run)
    thread.start()
    assert ready.wait(10)
    return thread


@pytest.mark.parametrize("gather_s", [5.0, 0.0])
def test_a_burst_that_wakes_the_engine_starts_in_one_step(gather_s):
    async def body(worker, engine):
        loop = asyncio.get_running_loop()
        first, second = Ticket(seq(0), loop), Ticket(seq(1), loop)
        later = _submit_later(worker, second, 0.3)  # far past the quiet window: only `incoming` holds it
        worker.submit(first)
        await asyncio.gather(events(first), events(second))
        later.join()
        return engine.steps[0]

    first_step = run_worker(body, gather_s=gather_s)
    assert first_step == ([0, 1] if gather_s else [0])


def test_a_lone_request_does_not_wait_out_the_gathering():
    async def body(worker, engine):
        loop = asyncio.get_running_loop()
        t0 = time.perf_counter()
        ticket = Ticket(seq(0), loop)
        worker.submit(ticket)
        await events(ticket)
        return time.perf_counter() - t0

    assert run_worker(body, gather_s=30.0) < 10  # nothing was on its way: no wait for the 30 s


def test_gathering_ends_after_gather_s_and_skips_a_busy_engine():
    """A request stuck on its way holds an idle engine back at most gather_s; one that arrives
    while sequences run starts at the next step, not held for the stuck one."""
    async def body(worker, engine):
        loop = asyncio.get_running_loop()
        release, counted = threading.Event(), threading.Event()
        stuck = Ticket(seq(9), loop)

        def on_its_way():
            with worker.incoming():
                counted.set()
                release.wait(30)
            worker.submit(stuck)

        thread = threading.Thread(target=on_its_way)
        thread.start()
        assert counted.wait(10)
        t0 = time.perf_counter()
        running = Ticket(seq(0, max_tokens=1000), loop)
        worker.submit(running)
        assert (await running.events.get()).kind == "added"
        assert (await running.events.get()).text == "a"  # after the gathering gave up on the stuck one
        waited = time.perf_counter() - t0
        engine.delay = 0.005
        t1 = time.perf_counter()
        extra = Ticket(seq(1), loop)
        worker.submit(extra)  # the engine is busy: no gathering, though the stuck one is still incoming
        assert (await extra.events.get()).kind == "added"
        assert (await extra.events.get()).text == "a"
        joined = time.perf_counter() - t1
        release.set()
        thread.join()
        worker.cancel(running)
        await asyncio.gather(events(stuck), events(extra))
        return waited, joined

    waited, joined = run_worker(body, gather_s=0.5)
    assert 0.5 <= waited < 10
    assert joined < 0.25
