"""How the model reaches its kernels without importing them.

The kernels (:mod:`glassllm.kernels`) take the model's layers and replace
their ``__call__``, so they sit on a layer above :mod:`glassllm.nn`, which may
not import them. The model asks this module instead: :func:`slots` once when
it is built (which of its layers a kernel may replace) and :func:`chosen`
around every forward (which kernel each of those layers runs in it). The
package's top-level facade (``glassllm/__init__.py``, on the top layer, loaded
before any ``glassllm`` module) installs the kernel dispatcher,
:mod:`glassllm.kernels.dispatch`, here when the package is imported; the
kernels themselves are imported the first time a model is built. With no
dispatcher installed every layer runs its reference.

This module imports nothing from glassllm.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import Callable

__all__ = ["install", "slots", "chosen"]

_load: Callable | None = None
_dispatch = None


def install(load: Callable) -> None:
    """Make ``load()`` -- the dispatcher, anything with ``slots(modules)`` and ``chosen(slots, n=, m=,
    cache=)`` -- what the model asks; ``load`` is called once, when a model first needs it."""
    global _load, _dispatch
    if not callable(load):
        raise TypeError(f"a dispatcher loader must be callable, got {type(load).__name__}")
    _load, _dispatch = load, None


def _dispatcher():
    global _dispatch
    if _dispatch is None and _load is not None:
        _dispatch = _load()
    return _dispatch


def slots(modules) -> tuple:
    """(layer, kernels that replace it) for every layer among ``modules`` that some kernel replaces."""
    dispatch = _dispatcher()
    return () if dispatch is None else dispatch.slots(modules)


def chosen(layer_slots, *, n: int, m: int, cache):
    """A context manager: within it each layer of ``layer_slots`` runs the kernel chosen for a forward
    of n new queries against m keys (its public ``kernel``); yields {layer: kernel}."""
    dispatch = _dispatcher()
    return nullcontext({}) if dispatch is None else dispatch.chosen(layer_slots, n=n, m=m, cache=cache)
