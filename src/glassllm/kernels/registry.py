"""The kernel registry: every fast path, what it replaces, and what it is tested against.

A *kernel* is a faster way to compute what a layer of :mod:`glassllm.nn` (or
the whole decoder) computes. The layer's ``__call__`` is the reference -- the
spec, step by step, every intermediate named -- and a kernel computes the same
numbers (to float rounding) with fewer, bigger operations. Each kernel is one
:class:`Kernel` record, registered once, in the table of :mod:`glassllm.kernels`:

- ``replaces``: the layer class whose ``__call__`` it stands in for
  (``glassllm.nn.Attention``, the class object itself);
- ``skips``: the layer's snapshot names it does not produce. When a tracer
  wants any of them (to record or to edit), the layer runs its reference
  instead: a traced name always runs the reference code;
- ``reference``: what ``tests/test_kernels.py`` compares it with, values and
  gradients, on the same inputs;
- ``applies``: the shapes it serves, ``applies(n, m, cache) -> bool`` for n new
  queries against m keys, with or without a KV cache; ``serves`` says the same
  in words, for :func:`glassllm.kernels.plan`;
- ``run``: the function, called as ``run(layer, *args)`` with the layer's own
  ``__call__`` arguments (for ``fast_decode``, which replaces the whole
  decoder's steps: the class, built as ``run(model)``).

When several kernels replace one layer, the first registered that applies
wins. :mod:`glassllm.kernels.dispatch` makes the choice, once per forward, and
puts it in the layer's public ``kernel`` attribute, which
:meth:`glassllm.nn.Module.run` reads; :func:`glassllm.kernels.plan` shows it.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

__all__ = ["Kernel", "KERNELS", "register", "kernels_for"]


@dataclass(frozen=True)
class Kernel:
    """One registered fast path (see the module docstring for the fields)."""

    name: str
    replaces: type
    skips: tuple[str, ...]
    reference: str
    run: Callable
    applies: Callable = lambda n, m, cache: True          # noqa: E731 -- every shape by default
    doc: str = ""
    serves: str = "every shape"

    def __post_init__(self):
        if not self.name or not isinstance(self.replaces, type):
            raise ValueError(f"kernel needs a name and the class whose __call__ it replaces, got "
                             f"{self.name!r} replacing {self.replaces!r}")


KERNELS: dict[str, Kernel] = {}


def register(kernel: Kernel) -> Kernel:
    """Add ``kernel`` to the registry (its name must be new); returns it."""
    if not isinstance(kernel, Kernel):
        raise TypeError(f"register needs a Kernel, got {type(kernel).__name__}")
    if kernel.name in KERNELS:
        raise ValueError(f"a kernel named {kernel.name!r} is already registered")
    KERNELS[kernel.name] = kernel
    return kernel


def kernels_for(cls: type) -> tuple[Kernel, ...]:
    """The kernels that replace exactly this class's ``__call__``, in registration order.

    Matched on the class itself, so a subclass (which may change ``__call__``) gets none.
    """
    return tuple(k for k in KERNELS.values() if k.replaces is cls)
