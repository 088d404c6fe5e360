"""The dispatcher: which layers run a kernel in this forward, chosen once per forward.

:class:`glassllm.nn.Transformer` asks once at the start of every forward:
:func:`chosen` walks the model's replaceable layers (found once, by
:func:`slots`) and gives each the first registered kernel that

1. is switched on (see :func:`disabled`),
2. serves this forward's shapes (``kernel.applies(n, m, cache)``), and
3. skips no snapshot that a tracer attached to the layer wants (a traced name
   always runs the reference);

or none, and then the layer runs its own ``__call__``, the reference. When the
forward ends, every layer is back on its reference, so a layer called on its
own (outside a model's forward) always runs the spec.

Decoding with :func:`glassllm.generate.generate` asks :func:`lean_decoding`
before each step whether the lean decoder (:mod:`glassllm.kernels.decode`) may
run the step instead of the model.

Switching kernels off, for a check or for reading::

    >>> import numpy as np
    >>> from glassllm import kernels
    >>> from glassllm.nn import Transformer
    >>> model = Transformer(seed=0)
    >>> fast = model(np.array([[1, 2, 3]])).data
    >>> with kernels.disabled():            # the reference path everywhere
    ...     spec = model(np.array([[1, 2, 3]])).data
    >>> bool(np.allclose(fast, spec, rtol=1e-5, atol=1e-6))
    True
"""

from __future__ import annotations

from contextlib import contextmanager

from .registry import KERNELS, Kernel, kernels_for

__all__ = ["disabled", "is_enabled", "slots", "chosen", "lean_decoding"]

# Names switched off by the active disabled() blocks; ALL stands for every kernel.
ALL = "*"
_off: list[frozenset] = []


@contextmanager
def disabled(*names: str):
    """Within the block, the named kernels (all of them, given no names) do not run: the layers
    they replace run their reference ``__call__`` and decoding runs the model.

    The switch is process-wide (like :func:`glassllm.autograd.no_grad`) and blocks nest.
    Raises ValueError for a name that is not registered.
    """
    unknown = [n for n in names if n not in KERNELS]
    if unknown:
        raise ValueError(f"no kernel named {unknown[0]!r}; registered: {', '.join(KERNELS)}")
    _off.append(frozenset(names) if names else frozenset({ALL}))
    try:
        yield
    finally:
        _off.pop()


def is_enabled(name: str) -> bool:
    """Is kernel ``name`` switched on (no active :func:`disabled` block names it)?"""
    return not any(ALL in s or name in s for s in _off)


def slots(modules) -> tuple:
    """(layer, kernels that replace it) for every layer among ``modules`` that some kernel replaces.

    Found once per model (the structure is fixed when it is built).
    """
    out = []
    for module in modules:
        options = kernels_for(type(module))
        if options:
            out.append((module, options))
    return tuple(out)


def _choose(module, options: tuple[Kernel, ...], n: int, m: int, cache) -> Kernel | None:
    for kernel in options:
        if not is_enabled(kernel.name) or not kernel.applies(n, m, cache):
            continue
        if module._tracer is not None and module.tracing(*kernel.skips):
            continue                        # a traced name runs the reference
        return kernel
    return None


@contextmanager
def chosen(layer_slots, *, n: int, m: int, cache):
    """Within the block (one forward of n new queries against m keys), each layer of
    ``layer_slots`` (from :func:`slots`) runs its chosen kernel; yields {layer: Kernel}."""
    plan = {}
    if not any(ALL in s for s in _off):
        for module, options in layer_slots:
            kernel = _choose(module, options, n, m, cache)
            if kernel is not None:
                module._kernel = kernel.run
                plan[module] = kernel
    try:
        yield plan
    finally:
        for module in plan:
            module._kernel = None


def lean_decoding(model) -> bool:
    """May the lean decoder run a decoding step of ``model``? Only when it is switched on and no
    tracer is attached (a tracer sees every step of the model's own forward)."""
    return is_enabled("fast_decode") and model._tracer is None
