"""Bounded work: a pool of workers with a bounded queue, and a rate limit per client.

:class:`WorkPool` runs the model's work on ``workers`` threads (by default one
per core) with at most ``queue`` jobs waiting. A job that finds every worker
busy and the queue full is not piled up: it raises :class:`Busy`, which the
server answers with 503 and ``Retry-After``. A job whose request went away
before it started is dropped from the queue.

:class:`RateLimiter` gives each client (its address) a bucket of ``burst``
requests that refills at ``rate`` per second; a request that finds the bucket
empty is refused (429, ``Retry-After``), so one client cannot take the queue
from the others.

>>> limiter = RateLimiter(rate=1.0, burst=2, clock=lambda: 0.0)
>>> [limiter.wait("10.0.0.5") for _ in range(3)]
[0.0, 0.0, 1.0]
"""

from __future__ import annotations

import asyncio
import math
import os
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from typing import Callable

from ..checks import check_int

__all__ = ["WorkPool", "RateLimiter", "Busy", "Limited", "default_workers"]


def default_workers() -> int:
    """One worker per core this process may use."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:                                        # not on Linux
        return max(1, os.cpu_count() or 1)


class Busy(Exception):
    """Every worker is busy and the queue is full: come back in ``retry_after`` seconds."""

    def __init__(self, retry_after: int):
        super().__init__(f"the inspector is busy; retry in {retry_after} s")
        self.retry_after = retry_after


class Limited(Exception):
    """A client sent more requests than its rate allows: come back in ``retry_after`` seconds."""

    def __init__(self, retry_after: int):
        super().__init__(f"too many requests from this address; retry in {retry_after} s")
        self.retry_after = retry_after


class WorkPool:
    """``workers`` threads, at most ``queue`` jobs waiting for one; :meth:`run` raises :class:`Busy` beyond."""

    def __init__(self, workers: int | None = None, queue: int = 32):
        workers = default_workers() if workers is None else workers
        workers, queue = check_int("workers", workers, low=1), check_int("queue", queue, low=0)
        self.workers, self.queue = workers, queue
        self._executor = ThreadPoolExecutor(workers, thread_name_prefix="glassllm-work")
        self._lock = threading.Lock()
        self._admitted = 0                    # running + waiting
        self._mean_s = 0.05                   # a running mean of how long a job takes
        self.refused = 0

    @property
    def admitted(self) -> int:
        return self._admitted

    def _retry_after(self) -> int:
        # The time for the jobs ahead to drain, rounded up: at least a second.
        return max(1, math.ceil(self._mean_s * self._admitted / self.workers))

    async def run(self, fn: Callable, *args):
        """``fn(*args)`` on a worker; :class:`Busy` at once if the pool and its queue are full."""
        with self._lock:
            if self._admitted >= self.workers + self.queue:
                self.refused += 1
                raise Busy(self._retry_after())
            self._admitted += 1

        def job():
            t0 = time.perf_counter()
            try:
                return fn(*args)
            finally:
                took = time.perf_counter() - t0
                with self._lock:
                    self._mean_s = 0.9 * self._mean_s + 0.1 * took

        future = self._executor.submit(job)
        future.add_done_callback(self._release)   # also when cancelled in the queue: the slot comes back
        return await asyncio.wrap_future(future)   # cancelling this (the client left) cancels a waiting job

    def _release(self, _future) -> None:
        with self._lock:
            self._admitted -= 1

    def close(self) -> None:
        self._executor.shutdown(wait=False, cancel_futures=True)


class RateLimiter:
    """Per-client token buckets: ``burst`` requests at once, refilled at ``rate`` per second.

    Memory stays bounded: past ``max_clients`` buckets, the full (idle) ones are forgotten.
    """

    def __init__(self, rate: float, burst: int, clock: Callable[[], float] = time.monotonic,
                 max_clients: int = 10_000):
        if isinstance(rate, bool) or not isinstance(rate, (int, float)) or not rate > 0 or math.isinf(rate):
            raise ValueError(f"rate must be a finite number > 0 (requests per second), got {rate!r}")
        burst = check_int("burst", burst, low=1)
        self.rate, self.burst, self.clock, self.max_clients = float(rate), burst, clock, max_clients
        self._buckets: dict[str, tuple[float, float]] = {}       # client -> (tokens, when)
        self._lock = threading.Lock()
        self.refused = 0

    def wait(self, client: str) -> float:
        """0 if ``client`` may send a request now (and count it), else the seconds until it may."""
        now = self.clock()
        with self._lock:
            tokens, when = self._buckets.get(client, (float(self.burst), now))
            tokens = min(float(self.burst), tokens + (now - when) * self.rate)
            if tokens >= 1.0:
                self._buckets[client] = (tokens - 1.0, now)
                if len(self._buckets) > self.max_clients:
                    self._forget_idle(now)
                return 0.0
            self._buckets[client] = (tokens, now)
            self.refused += 1
            return (1.0 - tokens) / self.rate

    def check(self, client: str) -> None:
        """Raise :class:`Limited` if ``client`` must wait."""
        wait = self.wait(client)
        if wait > 0:
            raise Limited(max(1, math.ceil(wait)))

    def _forget_idle(self, now: float) -> None:
        full = [c for c, (tokens, when) in self._buckets.items()
                if tokens + (now - when) * self.rate >= self.burst]
        for c in full:
            del self._buckets[c]
