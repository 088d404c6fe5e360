"""The inspector's trace cache: computed forward passes, bounded in bytes, least recently used out first.

A key names everything a result depends on -- the model (a digest of its
weights and config), the prompt's token ids, the intervention, the gradient's
target -- so a result is only ever handed to a request that would compute the
very same numbers. Switching layer, head, snapshot or value/gradient on a
prompt that is already traced is a lookup and a slice.

Identical requests that arrive together are computed once: the first one
computes, the others wait for its result (or its error, which is not kept).

>>> cache = TraceCache(max_bytes=1000)
>>> cache.get(("m", (1, 2)), lambda: "traced", size=lambda v: 10)
'traced'
>>> cache.get(("m", (1, 2)), lambda: "never called", size=lambda v: 10)
'traced'
>>> cache.stats()["hits"], cache.stats()["computed"]
(1, 1)
"""

from __future__ import annotations

import hashlib
import threading
from collections import OrderedDict
from concurrent.futures import Future
from typing import Any, Callable, Hashable

import numpy as np

from ..checks import check_int

__all__ = ["TraceCache", "model_digest", "nbytes"]


def model_digest(model) -> str:
    """A digest of a model's config and every weight: two models share cache entries only if equal."""
    h = hashlib.sha256(repr(sorted(model.config.to_dict().items())).encode())
    for name, p in sorted(model.named_parameters(), key=lambda item: item[0]):
        a = np.ascontiguousarray(p.data)
        h.update(f"{name}:{a.dtype.str}:{a.shape}".encode())
        h.update(a.view(np.uint8).data)
    return h.hexdigest()[:32]


def nbytes(*objects) -> int:
    """Bytes held by the arrays in ``objects`` (dicts, lists and tuples followed; each buffer counted once)."""
    seen: set[int] = set()
    total = 0
    stack = list(objects)
    while stack:
        x = stack.pop()
        if isinstance(x, np.ndarray):
            base = x
            while isinstance(base.base, np.ndarray):
                base = base.base
            if id(base) not in seen:
                seen.add(id(base))
                total += base.nbytes
        elif isinstance(x, dict):
            stack.extend(x.values())
        elif isinstance(x, (list, tuple)):
            stack.extend(x)
    return total


class TraceCache:
    """Results by key, at most ``max_bytes`` of them (least recently used dropped first); thread-safe.

    A single result larger than the whole cache is computed and returned but not kept.
    """

    def __init__(self, max_bytes: int):
        self.max_bytes = check_int("max_bytes", max_bytes, low=0)
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, tuple[Any, int]] = OrderedDict()
        self._pending: dict[Hashable, Future] = {}
        self._bytes = 0
        self._counts = {"hits": 0, "computed": 0, "joined": 0, "evicted": 0}

    def get(self, key: Hashable, compute: Callable[[], Any], size: Callable[[Any], int] = nbytes) -> Any:
        """The result for ``key``: kept, being computed by another thread (wait for it), or computed here."""
        with self._lock:
            if key in self._entries:
                self._entries.move_to_end(key)
                self._counts["hits"] += 1
                return self._entries[key][0]
            pending = self._pending.get(key)
            if pending is None:
                mine = self._pending[key] = Future()
            else:
                self._counts["joined"] += 1
        if pending is not None:
            return pending.result()                     # re-raises the computing thread's error
        try:
            value = compute()
        except BaseException as e:
            with self._lock:
                del self._pending[key]
            mine.set_exception(e)
            raise
        cost = size(value)
        with self._lock:
            del self._pending[key]
            self._counts["computed"] += 1
            if cost <= self.max_bytes:
                self._entries[key] = (value, cost)
                self._bytes += cost
                while self._bytes > self.max_bytes:
                    _, (_, dropped) = self._entries.popitem(last=False)
                    self._bytes -= dropped
                    self._counts["evicted"] += 1
        mine.set_result(value)
        return value

    def peek(self, key: Hashable) -> Any | None:
        """The kept result for ``key`` (no recency change), or None."""
        with self._lock:
            entry = self._entries.get(key)
            return None if entry is None else entry[0]

    def stats(self) -> dict:
        """Entries, bytes held, and how many lookups hit, computed, or joined a computation under way."""
        with self._lock:
            return {"entries": len(self._entries), "bytes": self._bytes, "max_bytes": self.max_bytes,
                    **self._counts}
