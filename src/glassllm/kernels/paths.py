"""Which path each layer takes: :func:`plan` asks the dispatcher, for shapes you give, and says why.

The model picks each layer's path at the start of every forward (see
:mod:`glassllm.kernels.dispatch`): the first registered kernel that is
switched on, serves the shapes and skips no snapshot a tracer wants -- or the
layer's own ``__call__``, the reference. :func:`plan` makes the same choice
without running anything and prints it, one line per kind of layer::

    >>> from glassllm import kernels
    >>> from glassllm.nn import Transformer
    >>> print(kernels.plan(Transformer(seed=0), n=16))        # doctest: +NORMALIZE_WHITESPACE
    16 new queries against 16 keys, no cache, no tracer:
      layers 0-3 attn_norm  fused_rms_norm      serves every shape
      layers 0-3 attn       fused_attention     serves every shape (tiled_self_attention: only n >= 128
                                                new queries, no cache; tiled_attention: only n >= 128
                                                new queries)
      layers 0-3 mlp_norm   fused_rms_norm      serves every shape
      layers 0-3 mlp        fused_feed_forward  serves every shape
      norm                  fused_rms_norm      serves every shape

``plan.paths`` is the same choice as a dict, in the form a trace records it
(:attr:`glassllm.trace.Trace.paths`). To run the reference: trace the layer
(a recorded snapshot always runs the reference) or ``with kernels.disabled():``.
"""

from __future__ import annotations

import textwrap
from dataclasses import dataclass

from ..checks import ParameterTypeError, check_int
from .dispatch import choose, is_enabled, slots
from .registry import kernels_for

__all__ = ["plan", "Plan", "PlanRow", "summary"]

REFERENCE = "reference"


@dataclass(frozen=True)
class PlanRow:
    """One layer's path: ``layer`` (its name, ``"layers.0.attn"``), ``path`` (a kernel's name or
    ``"reference"``) and ``because`` (why, in words)."""

    layer: str
    path: str
    because: str


class Plan:
    """The path of every layer a kernel may replace, for one forward; ``str(plan)`` is the table."""

    def __init__(self, rows: list[PlanRow], heading: str, decoding: PlanRow | None = None):
        self.rows = list(rows)
        self.heading = heading
        self.decoding = decoding          # generate's decoding steps (only when a cache is given)

    @property
    def paths(self) -> dict[str, str]:
        """{layer name: kernel name or "reference"}, as a trace records them."""
        return {row.layer: row.path for row in self.rows}

    def __repr__(self) -> str:
        return str(self)

    def __str__(self) -> str:
        groups = _grouped(self.rows)
        if self.decoding is not None:
            groups.append(("decoding steps", self.decoding.path, self.decoding.because))
        w1 = max(len(g[0]) for g in groups)
        w2 = max(len(g[1]) for g in groups)
        lines = [self.heading + ":"]
        for where, path, because in groups:
            lead = f"  {where:<{w1}}  {path:<{w2}}  "
            wrapped = textwrap.wrap(because, width=max(100 - len(lead), 30)) or [""]
            lines.append(lead + wrapped[0])
            lines += [" " * len(lead) + more for more in wrapped[1:]]
        return "\n".join(lines)


def _grouped(rows: list[PlanRow]) -> list[tuple[str, str, str]]:
    """Rows of blocks that take the same path for the same reason, as one line each ("layers 0-3 attn")."""
    out, blocks = [], {}
    for row in rows:
        parts = row.layer.split(".")
        if len(parts) == 3 and parts[0] == "layers" and parts[1].isdigit():
            key = (parts[2], row.path, row.because)
            if key not in blocks:
                blocks[key] = []
                out.append(key)
            blocks[key].append(int(parts[1]))
        else:
            out.append(row)
    lines = []
    for item in out:
        if isinstance(item, PlanRow):
            lines.append((item.layer, item.path, item.because))
        else:
            local, path, because = item
            numbers = blocks[item]
            lines.append((f"layer{'s' * (len(numbers) > 1)} {_ranges(numbers)} {local}", path, because))
    return lines


def _ranges(numbers: list[int]) -> str:
    """[0, 1, 2, 5] -> "0-2,5"."""
    spans, first, last = [], numbers[0], numbers[0]
    for x in numbers[1:] + [None]:
        if x is not None and x == last + 1:
            last = x
            continue
        spans.append(str(first) if first == last else f"{first}-{last}")
        if x is not None:
            first = last = x
    return ",".join(spans)


def _wants_of(traced):
    """``traced`` as a function of a list of full snapshot names -> does a tracer want any?"""
    if traced is None or traced is False:
        return None, "no tracer"
    if traced is True:
        return (lambda names: bool(names)), "a tracer recording every snapshot"
    if hasattr(traced, "wants"):
        return traced.wants, "the given tracer"
    if isinstance(traced, str):
        traced = [traced]
    try:
        wanted = frozenset(traced)
    except TypeError:
        raise ParameterTypeError("traced", f"must be True, False, a tracer or full snapshot names, "
                                           f"got {traced!r:.60}") from None
    if not all(isinstance(name, str) for name in wanted):
        raise ParameterTypeError("traced", f"must hold snapshot names (str), got {sorted(map(repr, wanted))[:3]}")
    shown = ", ".join(sorted(wanted)[:3]) + (", ..." if len(wanted) > 3 else "")
    return (lambda names: any(n in wanted for n in names)), f"a tracer wanting {shown}"


def plan(model, n: int, m: int | None = None, cache=None, traced=False) -> Plan:
    """Which kernel, or the reference, each layer of ``model`` runs in a forward of ``n`` new queries
    against ``m`` keys, and why.

    ``cache``: None (no KV cache; m = n), True (a cache holding m - n earlier positions; m defaults to
    n) or a :class:`~glassllm.nn.KVCache` (m = cache.start + n). ``traced``: False (no tracer), True (a
    tracer recording every snapshot, as :func:`glassllm.trace.trace` does by default), full snapshot
    names (``["layers.0.attn.softmax"]``) or a tracer object (anything with ``wants(names)``). The
    choice is the dispatcher's own (:func:`glassllm.kernels.dispatch.choose`), including the
    :func:`~glassllm.kernels.disabled` blocks active now.
    """
    if not (hasattr(model, "modules") and hasattr(model, "config")):
        raise ParameterTypeError("model", f"must be a glassllm Transformer, got {type(model).__name__}")
    n = check_int("n", n, low=1)
    start = 0
    if cache is not None and cache is not False and cache is not True:
        if not hasattr(cache, "start"):
            raise ParameterTypeError("cache", f"must be None, True or a KVCache, got {type(cache).__name__}")
        start = check_int("cache.start", cache.start, low=0)
        if m is not None and m != start + n:
            raise ParameterTypeError("m", f"must be cache.start + n = {start + n} with this cache, got {m!r}")
    m = start + n if m is None else check_int("m", m, low=n)
    has_cache = cache is not None and cache is not False
    wants, who = _wants_of(traced)
    rows = []
    for layer, options in slots(x for x in model.modules() if x is not model):
        reasons: list[str] = []
        kernel = choose(layer, options, n, m, has_cache or None, wants=wants, reasons=reasons)
        if kernel is None:
            rows.append(PlanRow(layer.prefix[:-1], REFERENCE, "; ".join(reasons)))
        else:
            because = f"serves {kernel.serves}"
            if reasons:
                because += f" ({'; '.join(reasons)})"
            rows.append(PlanRow(layer.prefix[:-1], kernel.name, because))
    heading = (f"{n} new {'query' if n == 1 else 'queries'} against {m} key{'s' * (m != 1)}, "
               f"{'a cache' if has_cache else 'no cache'}, {who}")
    return Plan(rows, heading, _decoding(model, has_cache, wants) if has_cache else None)


def _decoding(model, has_cache: bool, wants) -> PlanRow:
    """What runs :func:`glassllm.generate.generate`'s steps: the lean decoder (:mod:`.decode`) or the model."""
    for kernel in kernels_for(type(model)):
        if not is_enabled(kernel.name):
            return PlanRow("", "the layers above", f"{kernel.name} is switched off (kernels.disabled)")
        if wants is not None:
            return PlanRow("", "the layers above", f"{kernel.name} records nothing, and a tracer is attached")
        return PlanRow("", kernel.name, f"serves {kernel.serves} and no tracer is attached (generate asks "
                                        "before each step)")
    return PlanRow("", "the layers above", "no kernel replaces the whole model")


def summary(paths: dict[str, str]) -> str:
    """One line for {layer name: path} (a plan's or a trace's ``paths``): how many layers took each path.

    >>> summary({"layers.0.attn": "reference", "layers.0.mlp": "fused_feed_forward", "norm": "reference"})
    'layer paths: reference code x2, fused_feed_forward x1'
    >>> summary({"layers.0.attn": "reference", "norm": "reference"})
    'layer paths: every layer ran its reference code'
    """
    counts: dict[str, int] = {}
    for path in paths.values():
        counts[path] = counts.get(path, 0) + 1
    if not counts:
        return "layer paths: not recorded"
    if list(counts) == [REFERENCE]:
        return "layer paths: every layer ran its reference code"
    return "layer paths: " + ", ".join(f"{'reference code' if p == REFERENCE else p} x{k}" for p, k in counts.items())
