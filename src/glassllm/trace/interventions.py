"""Interventions: change a snapshot during the forward, so that everything downstream sees it.

An intervention checks its arguments once, when it is made (types, emptiness,
finite numbers: what holds for any model), and is bound to a model's registry
(:meth:`Intervention.bind` checks only what depends on the model, such as a
layer or head in range, and names the snapshots it edits) before it is applied
inside :meth:`Tracer.record` at every forward. Ablation and temperature are
written with autograd ops, so gradients still flow through the untouched
parts; an :class:`Edit` or a whole-snapshot :class:`Patch` is a constant.

:func:`from_fields` builds one of the four interventions the inspector's page
offers (``ablate``, ``mask_off``, ``temperature``, ``edit``) from plain fields:
it checks what only the page's fields have (which fields a kind takes, the page's
ranges, an edit's cell) and leaves the rest to the classes' own checks, binding
the intervention to the model as a tracer will.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .. import autograd as ag
from ..autograd import Tensor
from ..checks import ParameterError, is_int, is_number, shown
from ..config import ModelConfig
from ..positions import causal_mask
from .record import Step, Trace
from .registry import axis_sizes, check_index, resolve_all


def _constant(data: np.ndarray, like: Tensor) -> Tensor:
    """New values for a snapshot: a constant, but a leaf that still receives its gradient."""
    return Tensor(data, requires_grad=bool(ag.is_grad_enabled() and like.requires_grad))


def _index(value, what: str):
    """``value`` if it is an int (a layer or head number, checked against a model by ``bind``)."""
    if not is_int(value):
        raise TypeError(f"{what} must be an int, got {value!r}")
    return value


def _index_list(values, what: str = "layer"):
    """``values`` if it is None (every one), an int, or a non-empty list of ints; the model decides
    later (:func:`_indices`) which are in range."""
    if values is None or is_int(values):
        return values
    if not isinstance(values, (list, tuple, range, np.ndarray)):
        raise TypeError(f"{what}s must be an int, a list of ints or None, got {values!r}")
    if len(values) == 0:
        raise ValueError(f"{what}s is empty: give at least one {what}, or None for all")
    for i in values:
        _index(i, what)
    return values


def _indices(values, size: int, what: str = "layer") -> list[int]:
    """``values`` (checked by :func:`_index_list`) as a list of indices in [0, size), each once."""
    if values is None:
        return list(range(size))
    out = [check_index(i, what, size) for i in ([values] if is_int(values) else values)]
    twice = next((i for k, i in enumerate(out) if i in out[:k]), None)
    if twice is not None:
        raise ValueError(f"{what}s lists {what} {twice} twice: give each {what} once")
    return out


def _finite(name: str, what: str, values: np.ndarray, dtype) -> np.ndarray:
    """``values`` cast to ``dtype``, if they are real and still finite there; a ValueError naming
    the intervention otherwise (1e39 is finite in float64 but infinite in float32).

    A bool snapshot (the mask) takes only True/False, or the numbers 0 and 1.
    """
    if values.dtype.kind == "c":
        raise ValueError(f"{what} of {name!r}: the new values are complex; an edit must give finite real numbers")
    dtype = np.dtype(dtype)
    if dtype == np.bool_:
        if values.dtype != np.bool_ and not np.isin(values, (0, 1)).all():
            raise ValueError(f"{what} of {name!r}: a mask takes True/False (or 0/1), got other values")
        return values.astype(bool)
    with np.errstate(over="ignore", invalid="ignore"):
        cast = values.astype(dtype, copy=False)
    if not np.isfinite(cast).all():
        where = "" if not np.isfinite(values).all() else f" in {dtype.name}"
        raise ValueError(f"{what} of {name!r}: the new values are NaN or infinite{where}; "
                         "an edit must give finite real numbers")
    return cast


class Intervention:
    """Changes snapshots during the forward; the model goes on with the new value.

    Subclasses check their arguments in ``__init__`` (what holds for any model)
    and implement ``bind(axes, config) -> list of full names`` (called once by
    the :class:`Tracer`, checking what depends on the model: a layer or head in
    range, a vector of the model's width) and ``apply(name,
    t, step) -> Tensor`` (same shape; the batch axis is still there). ``bind``
    keeps what it resolves (``None`` = every layer, a :class:`Trace` reduced
    to a mean, ...) apart from the arguments the user gave, so one
    intervention can be bound again, to another model, and mean the same.
    """

    def bind(self, axes: dict, config: ModelConfig) -> list[str]:
        raise NotImplementedError

    def apply(self, name: str, t: Tensor, step: Step) -> Tensor:
        raise NotImplementedError


class Edit(Intervention):
    """Replace snapshot(s) ``names`` by ``fn(value)``, batch row by batch row.

    ``fn`` gets a copy of one row (batch removed, the documented shape) and
    returns an array of the same shape. The result is a constant: no gradient
    flows back through an edit to what produced the snapshot.
    """

    def __init__(self, names, fn):
        if not callable(fn):
            raise TypeError(f"Edit needs a function, got {type(fn).__name__}")
        self.patterns, self.fn = names, fn

    def bind(self, axes, config):
        return resolve_all(self.patterns, axes)

    def apply(self, name, t, step):
        rows = []
        for b in range(t.shape[0]):
            new = np.asarray(self.fn(np.array(t.data[b])))
            if new.shape != t.shape[1:]:
                raise ValueError(f"Edit of {name!r}: fn returned shape {new.shape}, expected {t.shape[1:]}")
            if new.dtype.kind not in "biufc":
                raise TypeError(f"Edit of {name!r}: fn returned {new.dtype} values, expected numbers")
            rows.append(_finite(name, "Edit", new, t.dtype))
        return _constant(np.stack(rows), t)

    def __repr__(self):
        return f"Edit({self.patterns!r}, fn={getattr(self.fn, '__name__', type(self.fn).__name__)})"


@dataclass(frozen=True)
class HookContext:
    """Where a :class:`Hook` is called: which snapshot, in which layer, and along which axes.

    ``axes``: the value's axis letters, batch first (``("B", "H", "n", "m")``
    for ``attn.softmax``); ``head_axis`` and ``position_axis`` index into
    them (None when the snapshot has no such axis); ``positions`` (n,) are
    the absolute positions of the step's queries, start .. start+n-1;
    ``layer`` is None outside the blocks. ``step`` is the tracer's
    :class:`Step` (its tokens, n, m, start).
    """

    name: str
    layer: int | None
    axes: tuple
    head_axis: int | None
    position_axis: int | None
    positions: np.ndarray
    step: Step


class Hook(Intervention):
    """Replace snapshot(s) ``names`` by ``fn(value, ctx)``, keeping the autograd graph (TransformerLens' hooks).

    ``value`` is the snapshot as a :class:`~glassllm.autograd.Tensor` *with*
    its batch axis (B, ...); ``ctx`` is a :class:`HookContext`. ``fn``
    returns the new value: a Tensor expression of ``value`` (so gradients
    flow back through it to everything upstream), a NumPy array (a constant:
    no gradient flows back), or None (unchanged: a hook that only looks).
    The result must keep the shape and dtype.

    >>> from glassllm.nn import Transformer
    >>> from glassllm.trace import trace
    >>> half_head_1 = Hook("layers.0.attn.mix",
    ...                    lambda v, ctx: v * np.array([1, 0.5, 1, 1], dtype=v.dtype)[:, None, None])
    >>> t = trace(Transformer(seed=0), [1, 2, 3], names="layers.0.attn.mix", interventions=half_head_1)
    >>> t.get("attn.mix", layer=0).shape
    (4, 3, 32)
    """

    def __init__(self, names, fn):
        if not callable(fn):
            raise TypeError(f"Hook needs a function fn(value, ctx), got {type(fn).__name__}")
        self.patterns, self.fn = names, fn

    def bind(self, axes, config):
        found = resolve_all(self.patterns, axes)
        self.axes = {**getattr(self, "axes", {}), **{k: axes[k] for k in found}}
        return found

    def apply(self, name, t, step):
        axes = ("B",) + tuple(self.axes[name])
        head = next((i for i, a in enumerate(axes) if a in ("H", "G")), None)
        ctx = HookContext(name, int(name.split(".")[1]) if name.startswith("layers.") else None, axes, head,
                          axes.index("n") if "n" in axes else None, np.arange(step.start, step.start + step.n), step)
        new = self.fn(t, ctx)
        if new is None:
            return t
        if isinstance(new, Tensor):
            return new
        new = np.asarray(new)
        if new.dtype.kind not in "biuf":
            raise TypeError(f"Hook of {name!r}: fn returned {new.dtype} values, expected a Tensor or numbers")
        return _constant(_finite(name, "Hook", new, t.dtype), t)

    def __repr__(self):
        return f"Hook({self.patterns!r}, fn={getattr(self.fn, '__name__', type(self.fn).__name__)})"


class Steer(Intervention):
    """Add ``scale * vector`` to snapshot(s) ``names`` at every position of every forward: a steering vector.

    ``names``: snapshots of the residual stream's width, axes (n, C) -- ``layers.{i}.resid_pre``,
    ``resid_mid``, ``resid_post``, ``attn.out``, ``mlp.out``, ``embed`` (a pattern may name several
    layers: each gets the vector). ``vector``: C numbers, e.g. the difference of two prompts' mean
    ``resid_pre`` at one layer. Gradients flow through (the sum keeps the graph). Under a
    :class:`~glassllm.trace.Tracer` it steers generation too: every decoding step adds it to its new
    position (a traced model always decodes through its own forward, so the edit is seen).

    >>> from glassllm.nn import Transformer
    >>> from glassllm.trace import Tracer, trace
    >>> model = Transformer(seed=0)
    >>> push = np.zeros(model.config.dim); push[0] = 1.0
    >>> t = trace(model, [1, 2], names="layers.1.resid_pre", interventions=Steer("layers.1.resid_pre", push, 3.0))
    >>> plain = trace(model, [1, 2], names="layers.1.resid_pre")
    >>> (t.get("layers.1.resid_pre") - plain.get("layers.1.resid_pre"))[:, :2].round(6).tolist()
    [[3.0, 0.0], [3.0, 0.0]]
    """

    def __init__(self, names, vector, scale: float = 1.0):
        if isinstance(scale, bool) or not isinstance(scale, (int, float, np.integer, np.floating)) \
                or not math.isfinite(scale):
            raise ValueError(f"Steer: scale must be a finite number, got {scale!r}")
        given = vector
        vector = np.asarray(np.asarray(vector) if not isinstance(vector, (str, bytes, dict)) else None)
        if vector.dtype.kind not in "biuf":
            raise TypeError(f"Steer: vector must be real numbers, got {type(given).__name__} of {vector.dtype}")
        if vector.ndim != 1:
            raise ValueError(f"Steer: vector must be one vector (C,), got shape {vector.shape}")
        if not np.isfinite(vector).all():
            raise ValueError("Steer: vector has NaN or infinite values; it must be finite real numbers")
        self.patterns, self.vector, self.scale = names, vector.astype(np.float64), float(scale)

    def bind(self, axes, config):
        found = resolve_all(self.patterns, axes)
        wrong = next((k for k in found if tuple(axes[k]) != ("n", "C")), None)
        if wrong is not None:
            raise ValueError(f"Steer adds to the residual stream: {wrong!r} has axes {axes[wrong]}, "
                             "expected (n, C) (resid_pre, resid_mid, resid_post, attn.out, mlp.out, embed)")
        if self.vector.shape != (config.dim,):
            raise ValueError(f"Steer: vector must have the model's width C={config.dim}, got shape {self.vector.shape}")
        return found

    def apply(self, name, t, step):
        return t + _finite(name, "Steer", self.scale * self.vector, t.dtype)         # (B, n, C) + (C,)

    def __repr__(self):
        return f"Steer({self.patterns!r}, vector=array({self.vector.shape[0]}), scale={self.scale})"


class ZeroAblate(Intervention):
    """Zero head ``head`` of layer ``layer``: its slice of ``attn.mix`` (the per-head output before W_O)."""

    def __init__(self, layer: int, head: int):
        self.layer, self.head = _index(layer, "layer"), _index(head, "head")

    def bind(self, axes, config):
        self._head = check_index(self.head, "head", config.n_heads)
        return [f"layers.{check_index(self.layer, 'layer', config.n_layers)}.attn.mix"]

    def apply(self, name, t, step):
        keep = np.ones((1, t.shape[1], 1, 1), dtype=t.dtype)            # (1, H, 1, 1)
        keep[0, self._head] = 0
        return t * keep                                                  # (B, H, n, D)

    def __repr__(self):
        return f"ZeroAblate(layer={self.layer}, head={self.head})"


class MeanAblate(Intervention):
    """Replace head ``head`` of layer ``layer`` (its ``attn.mix`` slice) by a mean output.

    ``mean``: a (D,) array, or a :class:`Trace` of reference text that recorded
    ``layers.{layer}.attn.mix``: the mean of that head over all its positions
    and steps, left padding excluded. (A mean over the current forward's own
    positions would let early positions see later ones, so it is not offered.)
    """

    def __init__(self, layer: int, head: int, mean):
        self.layer, self.head, self.mean = _index(layer, "layer"), _index(head, "head"), mean

    def bind(self, axes, config):
        layer = check_index(self.layer, "layer", config.n_layers)
        self._head = check_index(self.head, "head", config.n_heads)
        mean = self.mean
        if isinstance(mean, Trace):
            rows = [mean.get("attn.mix", layer=layer, head=self._head, step=s.index)
                    [max(0, s.pad - s.start):] for s in mean.steps]         # [(n_s, D)], padding dropped
            if not sum(len(r) for r in rows):
                raise ValueError("MeanAblate: the reference trace has no positions of text")
            mean = np.concatenate(rows).astype(np.float64).mean(axis=0)  # (D,)
        if mean is None or isinstance(mean, (str, bytes, dict)):
            raise TypeError(f"MeanAblate: mean must be {config.head_dim} numbers or a Trace, "
                            f"got {type(mean).__name__}")
        try:
            mean = np.asarray(mean, dtype=np.float64)
        except (TypeError, ValueError):
            raise TypeError(f"MeanAblate: mean must be {config.head_dim} numbers or a Trace, "
                            f"got {type(mean).__name__}") from None
        if mean.shape != (config.head_dim,):
            raise ValueError(f"MeanAblate: mean must be {config.head_dim} numbers (head size), got shape {mean.shape}")
        # finite here; apply checks it again in the model's dtype
        self._mean = _finite(f"layers.{layer}.attn.mix", "MeanAblate", mean, np.float64)
        return [f"layers.{layer}.attn.mix"]

    @property
    def head_mean(self) -> np.ndarray:
        """The (D,) vector that replaces the head: ``mean`` as given, or computed from its Trace by ``bind``."""
        if not hasattr(self, "_mean"):
            raise ValueError("MeanAblate.head_mean is known once the intervention is bound (given to a Tracer)")
        return self._mean

    def apply(self, name, t, step):
        H = t.shape[1]
        keep = np.ones((1, H, 1, 1), dtype=t.dtype)                      # (1, H, 1, 1)
        keep[0, self._head] = 0
        fill = np.zeros((1, H, 1, t.shape[3]), dtype=t.dtype)            # (1, H, 1, D)
        fill[0, self._head, 0] = _finite(name, "MeanAblate", self._mean, t.dtype)
        return t * keep + fill                                           # (B, H, n, D)

    def __repr__(self):
        given = self.mean if not isinstance(self.mean, Trace) else getattr(self, "_mean", None)  # bound: its mean
        mean = ("Trace" if isinstance(self.mean, Trace) and given is None else
                np.array2string(np.asarray(given), precision=6, separator=", ", max_line_width=10**6))
        return f"MeanAblate(layer={self.layer}, head={self.head}, mean={mean})"


class Patch(Intervention):
    """Set snapshot(s) ``names`` to the values another run recorded (activation patching).

    ``source``: a :class:`Trace` that recorded those names, or an array of
    the snapshot's shape (batch removed) for a single name. The source step
    defaults to the current step's index. ``positions``: indices along the
    snapshot's n axis to patch (default: all); ``heads``: indices along its
    head axis (H, or G for k, v, rope_k, cache_k, cache_v; default: all).
    Negative indices count from the end. Cells outside the selection keep
    their values (and their gradient). Every batch row gets the same patched
    values.
    """

    def __init__(self, names, source, step=None, positions=None, heads=None):
        if not isinstance(source, Trace):
            source = np.asarray(source)
            if source.dtype.kind not in "biuf" or (source.dtype.kind == "f" and not np.isfinite(source).all()):
                raise ValueError(f"Patch source must be finite real numbers (or a Trace), got {source.dtype} "
                                 f"{'with NaN or infinite values' if source.dtype.kind == 'f' else 'values'}")
        self.patterns, self.source, self.source_step = names, source, step
        self.positions = _int_list(positions, "positions")
        self.heads = _int_list(heads, "heads")

    def bind(self, axes, config):
        found = resolve_all(self.patterns, axes)
        if not isinstance(self.source, Trace) and len(found) != 1:
            raise ValueError(f"Patch with an array needs exactly one name; {self.patterns!r} matches {len(found)}")
        if isinstance(self.source, Trace):
            missing = [k for k in found if k not in self.source.names()]
            if missing:
                raise ValueError(f"Patch: the source trace did not record {missing[0]!r}")
        for what, letters, chosen in (("positions", ("n",), self.positions), ("heads", ("H", "G"), self.heads)):
            lacking = next((k for k in found if not set(letters) & set(axes[k])), None)
            if chosen is not None and lacking is not None:
                raise ValueError(f"Patch {what} need {'an n' if what == 'positions' else 'a head'} axis; "
                                 f"{lacking!r} has axes {axes[lacking]}")
        if self.heads is not None:
            for k in found:
                size = config.n_heads if "H" in axes[k] else config.n_kv_heads
                _indices(self.heads, size, "head")                       # in range, each once
        # a name's axes are the same in every model, so binding again only adds names
        self.axes = {**getattr(self, "axes", {}), **{k: axes[k] for k in found}}
        return found

    def apply(self, name, t, step):
        if isinstance(self.source, Trace):
            src_step = step.index if self.source_step is None else self.source_step
            value = self.source.get(name, step=src_step)
        else:
            value = self.source
        if value.shape != t.shape[1:]:
            raise ValueError(f"Patch of {name!r}: the source has shape {value.shape}, this forward has {t.shape[1:]}")
        value = np.broadcast_to(_finite(name, "Patch", value, t.dtype), t.shape)
        if self.positions is None and self.heads is None:
            return _constant(np.array(value), t)
        sel = np.ones((1,) * t.ndim, dtype=bool)
        axes = ("B",) + tuple(self.axes[name])
        for chosen, letters, what in ((self.positions, ("n",), "positions"), (self.heads, ("H", "G"), "heads")):
            if chosen is None:
                continue
            axis = next(i for i, a in enumerate(axes) if a in letters)  # bind checked there is one
            size = t.shape[axis]
            if any(not -size <= i < size for i in chosen):
                raise ValueError(f"Patch {what} {list(chosen)} out of range for {axes[axis]}={size}")
            along = np.zeros(size, dtype=bool)
            along[list(chosen)] = True
            sel = sel & along.reshape([-1 if i == axis else 1 for i in range(t.ndim)])  # broadcast along it
        sel = np.broadcast_to(sel, t.shape)
        if t.dtype == np.bool_:
            return Tensor(np.where(sel, value, t.data))
        return t * (~sel).astype(t.dtype) + np.where(sel, value, 0).astype(t.dtype)

    def __repr__(self):
        src = "Trace" if isinstance(self.source, Trace) else f"array{self.source.shape}"
        pos = "" if self.positions is None else f", positions={list(self.positions)}"
        heads = "" if self.heads is None else f", heads={list(self.heads)}"
        return f"Patch({self.patterns!r}, source={src}{pos}{heads})"


def _int_list(values, what: str):
    """None, an int or a non-empty list of ints, as a tuple of ints (or None)."""
    if values is None:
        return None
    arr = np.atleast_1d(np.asarray(values))
    if arr.size == 0:
        raise ValueError(f"Patch {what} is empty: give at least one, or None for all")
    if arr.dtype.kind not in "iu" or arr.ndim != 1:
        raise TypeError(f"Patch {what} must be an int or a list of ints, got {values!r}")
    return tuple(int(i) for i in arr)


class MaskOff(Intervention):
    """Switch off the causal mask of ``layers`` (default: all): every query sees every key, future included.

    (It also lifts a left-padding mask.) The spec's mask experiment.
    """

    def __init__(self, layers=None):
        self.layers = _index_list(layers)

    def bind(self, axes, config):
        return [f"layers.{i}.attn.mask" for i in _indices(self.layers, config.n_layers)]

    def apply(self, name, t, step):
        return Tensor(np.zeros(t.shape, dtype=bool))                     # (B, n, m)

    def __repr__(self):
        return f"MaskOff(layers={self.layers})"


class Temperature(Intervention):
    """Divide the attention scores of ``layers`` (default all) and ``heads`` (default all) by ``temperature``.

    Above 1 every row of attention weights gets flatter over the keys it may
    read; below 1 sharper. Masked keys stay at weight 0 (the mask comes after).
    The spec's temperature experiment.
    """

    def __init__(self, temperature: float, layers=None, heads=None):
        if isinstance(temperature, bool) or not isinstance(temperature, (int, float, np.floating, np.integer)) \
                or not math.isfinite(temperature) or temperature <= 0:
            raise ValueError(f"temperature must be a finite number > 0, got {temperature!r}")
        self.temperature = float(temperature)
        self.layers, self.heads = _index_list(layers), _index_list(heads, "head")

    def bind(self, axes, config):
        self._heads = None if self.heads is None else _indices(self.heads, config.n_heads, "head")
        return [f"layers.{i}.attn.scores" for i in _indices(self.layers, config.n_layers)]

    def apply(self, name, t, step):
        factor = np.ones((1, t.shape[1], 1, 1), dtype=t.dtype)          # (1, H, 1, 1)
        with np.errstate(over="ignore"):                                  # checked just below
            factor[0, self._heads if self._heads is not None else slice(None)] = 1.0 / self.temperature
            out = t * factor                                             # (B, H, n, m)
        if not np.isfinite(factor).all() or (np.isinf(out.data).any() and not np.isinf(t.data).any()):
            raise ValueError(f"temperature {self.temperature!r} is too small for {name}: its scores divided by it "
                             f"overflow {np.dtype(t.dtype).name}")
        return out

    def __repr__(self):
        return f"Temperature({self.temperature}, layers={self.layers}, heads={self.heads})"



# ----------------------------------------------------------------------------
# An intervention given by plain fields (the inspector's page and its JSON)
# ----------------------------------------------------------------------------

KINDS = ("ablate", "mask_off", "temperature", "edit")
MAX_EDIT_VALUE = 1e6  # an edited number's magnitude; far beyond anything the model computes, still float32-safe
MIN_SCORE_TEMPERATURE = 1e-3  # a score temperature; far below it, scores / T overflow float32
MAX_SCORE_TEMPERATURE = 100.0
HEAD_AXES = ("H", "G")  # axis letters that select a head; a head's slice keeps the axes after it


def from_fields(kind: str, layer: int, head: int | None = None, temperature: float | None = None,
                name: str | None = None, row: int | None = None, col: int | None = None,
                value: float | None = None, *, axes: dict, config: ModelConfig, n: int) -> Intervention:
    """The intervention ``kind`` of layer ``layer``, checked against a model and an ``n``-token prompt.

    ``ablate`` (:class:`ZeroAblate` of ``head``), ``mask_off`` (:class:`MaskOff` of the layer),
    ``temperature`` (:class:`Temperature` ``temperature`` in [0.001, 100], of ``head`` or every
    head), ``edit`` (:class:`Edit` setting cell ``row``, ``col`` of snapshot ``layers.{layer}.{name}``,
    head ``head`` when it has a head axis, to ``value`` in [-1e6, 1e6]). ``axes``: the model's
    registry (:func:`~glassllm.trace.registry`). A field the kind does not take, or a value out of
    range, raises :class:`~glassllm.checks.ParameterError` with one line naming it. The page's
    fields are numbers >= 0; the layer and the head are checked against the model by the
    intervention's own :meth:`~Intervention.bind`, as a tracer checks them.

    >>> from glassllm.nn import Transformer
    >>> from glassllm.trace import registry
    >>> model = Transformer(seed=0)
    >>> from_fields("ablate", 1, head=2, axes=registry(model), config=model.config, n=3)
    ZeroAblate(layer=1, head=2)
    >>> from_fields("ablate", 1, axes=registry(model), config=model.config, n=3)
    Traceback (most recent call last):
    glassllm.checks.ParameterError: intervention 'ablate' needs a head
    >>> from_fields("ablate", 9, head=0, axes=registry(model), config=model.config, n=3)
    Traceback (most recent call last):
    glassllm.checks.ParameterError: intervention layer=9 is out of range: expected 0..3 (or -4..-1 from the end)
    """
    if kind not in KINDS:
        _refuse(f"kind {shown(kind)} is unknown; expected one of {', '.join(map(repr, KINDS))}")
    for field, given in (("layer", layer), ("head", head), ("row", row), ("col", col)):
        if (given is not None or field == "layer") and (not is_int(given) or given < 0):
            _refuse(f"{field} {shown(given)} must be an int >= 0")
    if kind != "edit" and any(v is not None for v in (name, row, col, value)):
        _refuse(f"{kind!r} takes no name, row, col or value (those are for 'edit')")
    if kind == "edit":
        return _edit(layer, head, temperature, name, row, col, value, axes, config, n)
    if kind == "ablate" and head is None:
        _refuse("'ablate' needs a head")
    if kind == "temperature" and temperature is None:
        _refuse("'temperature' needs a temperature (a number in (0, 100])")
    if kind != "temperature" and temperature is not None:
        _refuse(f"{kind!r} takes no temperature; got {temperature}")
    if kind == "temperature" and not (is_number(temperature)
                                      and MIN_SCORE_TEMPERATURE <= temperature <= MAX_SCORE_TEMPERATURE):
        _refuse(f"temperature {shown(temperature)} is out of range: expected a number in "
                f"[{MIN_SCORE_TEMPERATURE}, {MAX_SCORE_TEMPERATURE:g}]")
    if kind == "mask_off" and head is not None:
        _refuse("'mask_off' switches the mask off for the whole layer; send head null")
    if kind == "ablate":
        made = ZeroAblate(layer, head)
    elif kind == "mask_off":
        made = MaskOff(layers=[layer])
    else:
        made = Temperature(temperature, layers=[layer], heads=head)
    _in_model(made.bind, axes, config)
    return made


def _in_model(check, *args):
    """``check(*args)``, a check against the model, with its refusal as the intervention's one line."""
    try:
        return check(*args)
    except ValueError as e:
        _refuse(str(e))


def _edit(layer, head, temperature, name, row, col, value, axes, config, n) -> Edit:
    """The ``edit`` kind of :func:`from_fields`: one cell of one snapshot inside the blocks."""
    missing = [f for f, v in (("name", name), ("row", row), ("col", col), ("value", value)) if v is None]
    if missing:
        _refuse(f"'edit' needs {', '.join(missing)}")
    if temperature is not None:
        _refuse(f"'edit' takes no temperature; got {temperature}")
    _in_model(check_index, layer, "layer", config.n_layers)
    full = f"layers.{layer}.{name}"
    if full not in axes:
        inside = sorted({k.split(".", 2)[2] for k in axes if k.startswith("layers.0.")})
        _refuse(f"'edit': {shown(name)} is not a snapshot inside the blocks; expected one of {', '.join(inside)}")
    if name == "attn.mask":
        _refuse("'edit' cannot set the boolean attn.mask; use 'mask_off'")
    if not is_number(value) or not -MAX_EDIT_VALUE <= value <= MAX_EDIT_VALUE:
        _refuse(f"'edit': value {shown(value)} is out of range: expected a number in "
                f"[{-MAX_EDIT_VALUE:g}, {MAX_EDIT_VALUE:g}]")
    names = axes[full]
    head_axis = next((a for a in names if a in HEAD_AXES), None)
    heads = {"H": config.n_heads, "G": config.n_kv_heads}.get(head_axis, 0)
    if head_axis is None and head is not None:
        _refuse(f"'edit': {name!r} has no head axis; send head null")
    if head_axis is not None and (head is None or head >= heads):
        _refuse(f"'edit': {name!r} needs a head in 0..{heads - 1}, got {head}")
    sizes = axis_sizes(config, n, n)
    matrix = [sizes[a] for a in names if a not in HEAD_AXES] + [1]     # (rows, cols[, 1]): a (n,) shows as (n, 1)
    if row >= matrix[0] or col >= matrix[1]:
        _refuse(f"'edit': cell ({row}, {col}) is outside {name!r}, which is {matrix[0]} x {matrix[1]} for this prompt")
    if name in ("attn.scores", "attn.softmax") and causal_mask(n, n)[row, col]:
        # (the prompt's pass: no cache, no padding)
        _refuse(f"'edit': cell ({row}, {col}) of {name!r} is a future key, masked by rule (its weight is 0 "
                "whatever the score); switch the mask off with 'mask_off' to let queries read the future")
    cell = ((head,) if head is not None else ()) + (row,)

    def set_cell(a):                                                     # one batch row, batch axis removed
        index = cell + ((col,) if a.ndim > len(cell) else ())            # a (n,) snapshot has no col
        a[index] = value
        return a
    return Edit(full, set_cell)


def _refuse(problem: str):
    raise ParameterError("intervention", problem)
