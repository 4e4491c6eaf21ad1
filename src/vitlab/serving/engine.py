"""The batching engine: worker processes, one queue, dynamic batches, admission control, restarts.

    server process (asyncio)                                   worker processes (one model each)
    request -> admit (503 past max_queue) -> decode (threads)
            -> queue of images --(one driver task per worker:           --pipe-->  forward pass (speed mode)
               first image waits at most batch_timeout for              <--pipe--  probabilities
               more, up to max_batch_size)--> answer each image's future

Every image is checked and decoded before it is queued, so a bad one is answered 4xx on its own and never joins a
batch. A worker that dies (killed, out of memory) is noticed by its driver or by the monitor within 0.2 s, its
batch goes back to the head of the queue once (a second death answers those images 500), and it is restarted
while `/health` says "restarting"; the other workers keep serving.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import logging
import math
import multiprocessing as mp
import os
import threading
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any

import numpy as np

from . import worker as worker_module
from .images import RequestError
from .worker import WorkerSpec

if TYPE_CHECKING:
    from .metrics import Metrics

__all__ = ["Engine", "WorkerFailed", "WorkerHandle"]

log = logging.getLogger("vitlab.serving")

_MONITOR_S = 0.2
_RESTART_BACKOFF_S = (0.5, 1, 2, 5, 10, 30)


class WorkerFailed(RuntimeError):
    """A worker could not start (the checkpoint, the mode, the device): the message is one line."""


class WorkerDied(RuntimeError):
    """The worker process went away in the middle of a batch."""


_context: Any = None
_context_lock = threading.Lock()


def _mp_context() -> Any:
    """A forkserver that has imported torch and the worker once: each (re)start is a fork, safe (the forkserver runs
    no threads and no torch op) and quick (no interpreter start, no torch import)."""
    global _context
    with _context_lock:
        if _context is None:
            # GNU OpenMP threads spin between parallel regions by default: a worker's idle threads would take the
            # cores the server process decodes images on (measured: 3.4x the throughput of ViT-Ti/16 on 2 cores
            # with PASSIVE). Only the processes started from here read it; the user's own setting wins.
            os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
            ctx = mp.get_context("forkserver")
            ctx.set_forkserver_preload([worker_module.__name__])
            _context = ctx
        return _context


class WorkerHandle:
    """One worker process and its pipe; `call` is blocking and runs on the handle's own thread."""

    def __init__(self, spec: WorkerSpec):
        self.spec = spec
        self.index = spec.index
        self.state = "starting"  # starting | ready | restarting | failed | stopped
        self.restarts = 0
        self.info: dict[str, Any] = {}
        self.process: Any = None
        self.conn: Connection | None = None
        self.executor = ThreadPoolExecutor(1, thread_name_prefix=f"vitlab-serve-worker-{spec.index}")

    @property
    def pid(self) -> int | None:
        return self.process.pid if self.process is not None else None

    def alive(self) -> bool:
        return self.process is not None and self.process.exitcode is None

    def exitcode(self) -> int | None:
        return self.process.exitcode if self.process is not None else None

    def start(self) -> None:
        """Start the process and wait until it is warm; WorkerFailed (one line) if it cannot load or build."""
        ctx = _mp_context()
        parent, child = ctx.Pipe()
        process = ctx.Process(target=worker_module.main, args=(child, self.spec),
                              name=f"vitlab-serve-worker-{self.index}")
        process.start()
        child.close()
        try:
            while not parent.poll(0.2):
                if process.exitcode is not None:
                    raise WorkerFailed(f"worker {self.index} exited with code {process.exitcode} while loading")
            msg = parent.recv()
        except (EOFError, OSError):
            process.join(5)
            raise WorkerFailed(f"worker {self.index} exited with code {process.exitcode} while loading") from None
        if msg[0] != "ready":
            process.join(10)
            raise WorkerFailed(str(msg[1]))
        self.process, self.conn, self.info = process, parent, msg[1]
        self.state = "ready"

    def call(self, msg: tuple[Any, ...]) -> tuple[Any, ...]:
        """Send one request, wait for its answer; WorkerDied if the process went away."""
        if self.conn is None:
            raise WorkerDied(f"worker {self.index} is not running")
        try:
            self.conn.send(msg)
            return self.conn.recv()
        except (EOFError, OSError) as e:
            raise WorkerDied(f"worker {self.index} died") from e

    def stop(self, timeout: float = 10.0) -> None:
        """Ask the process to exit; kill it if it does not within `timeout` seconds."""
        self.state = "stopped"
        if self.conn is not None:
            with contextlib.suppress(OSError, EOFError, ValueError):
                self.conn.send(("stop",))
        if self.process is not None:
            self.process.join(timeout)
            if self.process.exitcode is None:
                self.process.kill()
                self.process.join(5)
        self.discard()

    def discard(self) -> None:
        """Forget a dead process (close the pipe, reap it)."""
        if self.conn is not None:
            with contextlib.suppress(OSError):
                self.conn.close()
        if self.process is not None and self.process.exitcode is not None:
            with contextlib.suppress(ValueError):
                self.process.close()
            self.process = None
        self.conn = None

    def describe(self) -> dict[str, Any]:
        return {"index": self.index, "state": self.state, "pid": self.pid if self.alive() else None,
                "restarts": self.restarts, "mode": self.info.get("mode")}


@dataclass
class _Item:
    """One image waiting for a worker."""

    kind: str  # "predict" | "explain"
    x: np.ndarray  # (C, H, W) float32
    future: asyncio.Future[Any]
    queued_at: float
    retries: int = 0


@dataclass
class _Admission:
    """Requests admitted and not answered yet (the bound that makes overload a 503, not a growing queue)."""

    limit: int
    count: int = 0


class Engine:
    """Worker processes behind one bounded queue with dynamic batching (see the module docstring).

    Use from the server's event loop: `start()` (blocking: builds and warms every worker), `await run()` to start
    the drivers, `admit()` around each request, `await predict(images)` / `await explain(image)`, `await close()`.
    """

    def __init__(self, specs: list[WorkerSpec], *, max_batch_size: int, batch_timeout: float, max_queue: int,
                 metrics: Metrics):
        self.workers = [WorkerHandle(s) for s in specs]
        self.max_batch_size = max_batch_size
        self.batch_timeout = batch_timeout
        self.metrics = metrics
        self._admission = _Admission(max_queue)
        self._queue: collections.deque[_Item] = collections.deque()
        self._wakeup: asyncio.Event | None = None
        self._tasks: list[asyncio.Task[None]] = []
        self._closing = False
        self._seconds_per_image = 0.0  # moving average over batches: what Retry-After is estimated from

    # -- life cycle ------------------------------------------------------------------------------------------------

    def start(self) -> None:
        """Start every worker at once and wait until all are warm; WorkerFailed (and none left running) if any
        cannot start."""
        errors: list[BaseException] = []

        def one(w: WorkerHandle) -> None:
            try:
                w.start()
            except BaseException as e:
                errors.append(e)

        threads = [threading.Thread(target=one, args=(w,), daemon=True) for w in self.workers]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        if errors:
            for w in self.workers:
                w.stop(timeout=5)
            first = errors[0]
            raise first if isinstance(first, WorkerFailed) else WorkerFailed(str(first))
        self.metrics.workers_ready.set(len(self.workers))

    async def run(self) -> None:
        """Start one driver task per worker and the monitor (call once, in the server's event loop)."""
        self._wakeup = asyncio.Event()
        self._tasks = [asyncio.create_task(self._drive(w), name=f"vitlab-serve-driver-{w.index}")
                       for w in self.workers]
        self._tasks.append(asyncio.create_task(self._monitor(), name="vitlab-serve-monitor"))

    async def close(self) -> None:
        """Stop taking batches (what is queued is answered first), then stop the workers."""
        self._closing = True
        self._wake()
        with contextlib.suppress(asyncio.CancelledError):
            await asyncio.wait_for(asyncio.gather(*self._tasks[:-1], return_exceptions=True), timeout=60)
        for t in self._tasks:
            t.cancel()
        loop = asyncio.get_running_loop()
        await asyncio.gather(*(loop.run_in_executor(None, w.stop) for w in self.workers))
        for w in self.workers:
            w.executor.shutdown(wait=False)
        for item in self._queue:  # anything left (a driver cut off by the timeout above)
            if not item.future.done():
                item.future.set_exception(RequestError(503, "shutting_down", "the server is shutting down"))
        self._queue.clear()

    # -- admission ---------------------------------------------------------------------------------------------------

    @contextlib.contextmanager
    def admit(self) -> Iterator[None]:
        """Hold one of `max_queue` places for the request's whole life; 503 with Retry-After when none is free."""
        a = self._admission
        if self._closing:
            raise RequestError(503, "shutting_down", "the server is shutting down", {"Retry-After": "1"})
        if a.count >= a.limit:
            raise RequestError(503, "overloaded", f"the server is at capacity ({a.limit} requests in flight); "
                               "retry after the time Retry-After says", {"Retry-After": str(self.retry_after())})
        a.count += 1
        self.metrics.in_flight.set(a.count)
        try:
            yield
        finally:
            a.count -= 1
            self.metrics.in_flight.set(a.count)

    def retry_after(self) -> int:
        """Seconds until the queue has drained at the measured rate (1..60)."""
        ready = max(1, sum(w.state == "ready" for w in self.workers))
        estimate = len(self._queue) * self._seconds_per_image / ready
        return int(min(60, max(1, math.ceil(estimate))))

    @property
    def in_flight(self) -> int:
        return self._admission.count

    @property
    def queue_depth(self) -> int:
        return len(self._queue)

    # -- requests ------------------------------------------------------------------------------------------------------

    async def predict(self, images: list[np.ndarray]) -> list[np.ndarray]:
        """Class probabilities of each (C, H, W) image, batched with whatever else is queued."""
        futures = [self._put("predict", x) for x in images]
        return [r[0] for r in await asyncio.gather(*futures)]

    async def explain(self, image: np.ndarray) -> tuple[np.ndarray, np.ndarray | None]:
        """(probabilities, (gh, gw) attention rollout or None) of one image, in a batch of its own."""
        probs, rollout = await self._put("explain", image)
        return probs, rollout

    def _put(self, kind: str, x: np.ndarray) -> asyncio.Future[Any]:
        if self._closing:
            raise RequestError(503, "shutting_down", "the server is shutting down", {"Retry-After": "1"})
        loop = asyncio.get_running_loop()
        item = _Item(kind, x, loop.create_future(), loop.time())
        self._queue.append(item)
        self.metrics.queue_depth.set(len(self._queue))
        self._wake()
        return item.future

    def _wake(self) -> None:
        if self._wakeup is not None:
            self._wakeup.set()

    # -- the drivers ---------------------------------------------------------------------------------------------------

    async def _next_batch(self, w: WorkerHandle) -> list[_Item] | None:
        """The next batch for worker `w`: up to max_batch_size predict images (or one explain image), the first of
        them waiting at most batch_timeout for more. None when closing and the queue is empty; [] when the worker
        died while waiting."""
        assert self._wakeup is not None
        loop = asyncio.get_running_loop()
        while True:
            if not w.alive():
                return []
            if not self._queue:
                if self._closing:
                    return None
                self._wakeup.clear()
                await self._wakeup.wait()
                continue
            first = self._queue[0]
            if first.kind == "predict" and not self._closing:
                wait = first.queued_at + self.batch_timeout - loop.time()
                if wait > 0 and self._leading_predicts() < self.max_batch_size:
                    self._wakeup.clear()
                    with contextlib.suppress(TimeoutError):
                        await asyncio.wait_for(self._wakeup.wait(), wait)
                    continue  # look again: another driver may have taken them
            return self._pop_batch()

    def _leading_predicts(self) -> int:
        n = 0
        for item in self._queue:
            if item.kind != "predict" or n >= self.max_batch_size:
                break
            n += 1
        return n

    def _pop_batch(self) -> list[_Item]:
        first = self._queue.popleft()
        batch = [first]
        if first.kind == "predict":
            while self._queue and len(batch) < self.max_batch_size and self._queue[0].kind == "predict":
                batch.append(self._queue.popleft())
        self.metrics.queue_depth.set(len(self._queue))
        return batch

    async def _drive(self, w: WorkerHandle) -> None:
        """Feed worker `w` batches until the engine closes; restart it when it dies."""
        loop = asyncio.get_running_loop()
        while True:
            if w.state == "stopped":
                return
            if not w.alive():
                if self._closing and not self._queue:
                    return
                await self._restart(w)
                continue
            batch = await self._next_batch(w)
            if batch is None:
                return
            if not batch:
                continue
            batch = [item for item in batch if not item.future.done()]
            if not batch:
                continue
            x = np.stack([item.x for item in batch])  # (B, C, H, W)
            try:
                reply = await loop.run_in_executor(w.executor, w.call, (batch[0].kind, x))
            except WorkerDied:
                self._requeue(batch)
                continue
            self._answer(batch, reply)

    def _answer(self, batch: list[_Item], reply: tuple[Any, ...]) -> None:
        if reply[0] != "ok":
            error = RequestError(500, "inference_failed", str(reply[1]))
            for item in batch:
                if not item.future.done():
                    item.future.set_exception(error)
            return
        probs, seconds = reply[1], float(reply[2])
        rollout = reply[3] if len(reply) > 3 else None
        self.metrics.batch_size.observe(len(batch))
        self.metrics.inference.observe(seconds)
        self.metrics.images.inc(len(batch))
        per_image = seconds / len(batch)
        self._seconds_per_image = per_image if not self._seconds_per_image else (
            0.8 * self._seconds_per_image + 0.2 * per_image)
        for n, item in enumerate(batch):
            if not item.future.done():
                item.future.set_result((probs[n], rollout))

    def _requeue(self, batch: list[_Item]) -> None:
        """A worker died with `batch`: once, the images go back to the head of the queue; twice, they fail."""
        for item in reversed(batch):
            if item.future.done():
                continue
            if item.retries >= 1:
                item.future.set_exception(RequestError(500, "worker_died", "the inference worker died twice on "
                                                       "this request"))
            else:
                item.retries += 1
                self._queue.appendleft(item)
        self.metrics.queue_depth.set(len(self._queue))
        self._wake()

    async def _restart(self, w: WorkerHandle) -> None:
        """Replace a dead worker, retrying with back-off while it cannot start."""
        loop = asyncio.get_running_loop()
        log.warning("worker %d (pid %s) exited with code %s; restarting it", w.index, w.pid, w.exitcode())
        w.discard()
        w.state = "restarting"
        self.metrics.workers_ready.set(sum(x.state == "ready" for x in self.workers))
        for attempt in range(10**9):
            if self._closing and not self._queue:
                w.state = "stopped"
                return
            try:
                await loop.run_in_executor(w.executor, w.start)
                break
            except WorkerFailed as e:
                w.state = "failed"
                delay = _RESTART_BACKOFF_S[min(attempt, len(_RESTART_BACKOFF_S) - 1)]
                log.error("worker %d could not restart (%s); trying again in %g s", w.index, e, delay)
                await asyncio.sleep(delay)
        w.restarts += 1
        self.metrics.worker_restarts.inc()
        self.metrics.workers_ready.set(sum(x.state == "ready" for x in self.workers))
        log.warning("worker %d restarted (pid %s)", w.index, w.pid)

    async def _monitor(self) -> None:
        """Notice a worker that died while idle (its driver waits for images), so it restarts now and /health says
        so meanwhile."""
        while True:
            await asyncio.sleep(_MONITOR_S)
            for w in self.workers:
                if w.state == "ready" and not w.alive():
                    w.state = "restarting"
                    self.metrics.workers_ready.set(sum(x.state == "ready" for x in self.workers))
                    self._wake()

    # -- health --------------------------------------------------------------------------------------------------------

    def health(self) -> tuple[str, list[dict[str, Any]]]:
        """("ok" | "degraded" | "unavailable" | "shutting_down", one dict per worker)."""
        workers = [w.describe() for w in self.workers]
        ready = sum(w["state"] == "ready" for w in workers)
        if self._closing:
            status = "shutting_down"
        elif ready == len(workers):
            status = "ok"
        elif ready:
            status = "degraded"
        else:
            status = "unavailable"
        return status, workers

    def mode(self) -> str:
        """The speed mode the workers run ("auto" resolved to what it chose)."""
        return str(next((w.info.get("mode") for w in self.workers if w.info.get("mode")), ""))
