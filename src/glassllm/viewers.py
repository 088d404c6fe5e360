"""How a recorded trace reaches the inspector without the trace layer importing it.

The inspector builds on the tracer, so :mod:`glassllm.trace` may not import it.
:meth:`glassllm.trace.Trace.show` asks this module for the trace viewer
instead, and the package's top-level facade (``glassllm/__init__.py``, on the
top layer, loaded before any ``glassllm`` module) registers the inspector's
notebook view here when the package is imported. The viewer itself is
imported only when a trace is shown.

This module imports nothing from glassllm.
"""

from __future__ import annotations

from typing import Callable

__all__ = ["register_trace_viewer", "trace_viewer"]

_viewer: Callable | None = None


def register_trace_viewer(viewer: Callable) -> None:
    """Make ``viewer(trace, tokenizer=None, *, height=...)`` the function that shows a recorded trace."""
    global _viewer
    if not callable(viewer):
        raise TypeError(f"a trace viewer must be callable, got {type(viewer).__name__}")
    _viewer = viewer


def trace_viewer() -> Callable:
    """The registered trace viewer; a one-line error if none is."""
    if _viewer is None:
        raise RuntimeError("no trace viewer is registered: call glassllm.inspector.show(trace) instead")
    return _viewer
