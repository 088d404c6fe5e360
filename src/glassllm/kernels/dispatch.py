"""The dispatcher: which layers run a kernel in this forward, chosen once per forward.

:class:`glassllm.nn.Transformer` asks once at the start of every forward
(through :mod:`glassllm.dispatcher`, since the model sits below the kernels):
:func:`chosen` walks the model's replaceable layers (found once, by
:func:`slots`) and gives each the first registered kernel that

1. is switched on (see :func:`disabled`),
2. serves this forward's shapes (``kernel.applies(n, m, cache)``), and
3. skips no snapshot that a tracer attached to the layer wants (a traced name
   always runs the reference);

or none, and then the layer runs its own ``__call__``, the reference. The
choice is the layer's public ``kernel`` attribute, read in one place,
:meth:`glassllm.nn.Module.run` (the model runs its layers through it). When the
forward ends, every layer is back on its reference, so a layer called on its
own (outside a model's forward) always runs the spec. :func:`glassllm.kernels.plan`
prints the choice, with the reasons, for any shapes.

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

__all__ = ["disabled", "is_enabled", "slots", "choose", "chosen", "lean_decoding"]

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


def choose(module, options: tuple[Kernel, ...], n: int, m: int, cache, wants=None,
           reasons: list | None = None) -> Kernel | None:
    """The first of ``options`` that runs ``module`` in a forward of n new queries against m keys, or
    None: the reference runs.

    A kernel runs when it is switched on, serves the shapes (``kernel.applies``) and skips no snapshot
    that ``wants(full names)`` asks for (default: the tracer attached to the layer, if any). Given a list
    ``reasons``, each kernel passed over adds one line saying why.
    """
    if wants is None:
        wants = None if module.tracer is None else module.tracer.wants
    for kernel in options:
        if not is_enabled(kernel.name):
            why = "switched off"
        elif not kernel.applies(n, m, cache):
            why = f"only {kernel.serves}"
        else:
            traced = None if wants is None else _traced(module, kernel, wants)
            if traced is None:
                return kernel
            why = f"skips {traced}, which is traced"
        if reasons is not None:
            reasons.append(f"{kernel.name}: {why}")
    return None


def _traced(module, kernel: Kernel, wants) -> str | None:
    """The first snapshot that ``kernel`` skips and ``wants`` asks for (local name), or None."""
    if not kernel.skips or not wants([module.prefix + s for s in kernel.skips]):
        return None
    return next((s for s in kernel.skips if wants([module.prefix + s])), kernel.skips[0])


@contextmanager
def chosen(layer_slots, *, n: int, m: int, cache):
    """Within the block (one forward of n new queries against m keys), each layer of
    ``layer_slots`` (from :func:`slots`) runs its chosen kernel; yields {layer: Kernel}.

    The choice goes into each layer's public ``kernel`` attribute, which
    :meth:`glassllm.nn.Module.run` reads; after the block every layer is back on its reference.
    """
    plan = {}
    if not any(ALL in s for s in _off):
        for module, options in layer_slots:
            kernel = choose(module, options, n, m, cache)
            if kernel is not None:
                module.kernel = kernel
                plan[module] = kernel
    try:
        yield plan
    finally:
        for module in plan:
            module.kernel = None


def lean_decoding(model) -> bool:
    """May the lean decoder run a decoding step of ``model``? Only when it is switched on and no
    tracer is attached (a tracer sees every step of the model's own forward)."""
    return is_enabled("fast_decode") and model.tracer is None
