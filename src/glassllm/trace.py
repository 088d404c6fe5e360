"""The tracer: every intermediate tensor of the model by a stable name, forward and backward.

Names. Every module lists the tensors it computes (``SNAPSHOTS`` in
:mod:`glassllm.nn`); walking the modules gives the *registry*, full name ->
axis letters, in the order a forward pass produces them::

    embed
    layers.{i}.resid_pre  layers.{i}.attn_norm.in|rms|out
    layers.{i}.attn.q|k|v|rope_q|rope_k|cache_k|cache_v|scores|mask|softmax|mix|out
    layers.{i}.resid_mid  layers.{i}.mlp_norm.in|rms|out
    layers.{i}.mlp.gate|up|act|prod|out   layers.{i}.resid_post
    norm.in|rms|out  logits  probs

``docs/snapshots.md`` is the table of every name with its axes and shape
(generated from the registry by :func:`snapshot_table`). Axes use the shape
legend -- n new queries, m keys (m = start + n), H query heads, G key/value
heads, D head dim, C model width, V vocabulary, F MLP width -- and the batch
axis is always removed: a :class:`Tracer` keeps one batch row (``batch=0``).

Recording. A :class:`Tracer` is a context manager around anything that runs
the model: a forward pass, a cached generation, a backward pass. Each forward
is one *step* with its own n, m and start (a cached generation records a
prefill with n = m = prompt length, then steps with n = 1, m = start + 1).
``names=`` stores only some snapshots (exact names, globs such as
``layers.2.attn.*``, or layer-local names such as ``attn.softmax`` for every
layer); ``dtype=`` casts what is stored. Snapshots that are not asked for cost
nothing: the model keeps its fused fast path for them.

Gradients. When a backward pass runs inside the ``with`` block, every recorded
snapshot also gets ``d loss / d snapshot`` under the same name. Each name is
its own node in the graph, so the gradient of a name is the sensitivity of the
loss to *that use* of the value: ``layers.0.attn_norm.in`` holds the same
numbers as ``layers.0.resid_pre``, but its gradient is only the part that flows
through the norm (the residual path is counted in ``resid_pre``'s). Editing a
snapshot by an intervention changes the loss by exactly this gradient, to
first order.

Interventions (:class:`Edit`, :class:`ZeroAblate`, :class:`MeanAblate`,
:class:`Patch`, :class:`MaskOff`, :class:`Temperature`) replace a snapshot
during the forward, so everything downstream sees the new value. The stored
snapshot is the value the model went on with (after the intervention).

Export: :meth:`Trace.save` writes a ``.npz`` (a zip of ``.npy`` arrays) that
also holds ``manifest.json`` (names, shapes, axes, tokens, config);
:func:`load_trace` reads it back, validating every field.

>>> from glassllm.nn import Transformer
>>> model = Transformer(ModelConfig(), seed=0)
>>> t = trace(model, [5, 6, 7], names=["layers.0.attn.softmax", "attn.k"])
>>> t.get("layers.0.attn.softmax").shape, t.get("attn.softmax", layer=0, head=3).shape
((4, 3, 3), (3, 3))
>>> t.get("attn.k", layer=1).shape
(2, 3, 32)
"""

from __future__ import annotations

import fnmatch
import json
import math
import re
import zipfile
from dataclasses import dataclass, field
from functools import lru_cache
from pathlib import Path

import numpy as np

from . import autograd as ag
from .autograd import Tensor
from .checkpoint import atomic_path
from .config import ModelConfig

__all__ = [
    "Tracer", "Trace", "Step", "trace", "load_trace", "registry", "names", "snapshot_shape",
    "Intervention", "Edit", "ZeroAblate", "MeanAblate", "Patch", "MaskOff", "Temperature",
    "snapshot_table", "validate_manifest", "FORMAT", "VERSION",
]

FORMAT = "glassllm-trace"
VERSION = 1
STORAGE_DTYPES = ("float16", "float32", "float64")
MAX_LAYERS = 1024              # a trace file naming more layers than this is refused
MAX_MANIFEST_BYTES = 64 << 20

# Snapshots that are views into buffers the model later overwrites (the KV
# cache's arrays, when a cache is rewound or reused): always stored as copies.
# Every other snapshot is a fresh array that no op ever writes into again.
_BUFFER_VIEWS = ("cache_k", "cache_v")


# ----------------------------------------------------------------------------
# The registry: names, axes, shapes
# ----------------------------------------------------------------------------

def registry(model_or_config=None) -> dict[str, tuple[str, ...]]:
    """Every snapshot name -> its axis letters (batch removed), in forward order.

    Takes a model (its modules are walked) or a :class:`ModelConfig` (a
    skeleton of the same depth is walked; names depend only on ``n_layers``).
    """
    if model_or_config is None:
        model_or_config = ModelConfig()
    if isinstance(model_or_config, ModelConfig):
        if model_or_config.n_layers > MAX_LAYERS:
            raise ValueError(f"n_layers={model_or_config.n_layers} exceeds the tracer's limit of {MAX_LAYERS}")
        return dict(_skeleton_registry(model_or_config.n_layers))
    if callable(getattr(model_or_config, "snapshot_axes", None)):
        return dict(model_or_config.snapshot_axes())
    raise TypeError(f"expected a Transformer or a ModelConfig, got {type(model_or_config).__name__}")


@lru_cache(maxsize=8)
def _skeleton_registry(n_layers: int) -> tuple:
    from .nn import Transformer

    # The smallest model with this many layers: same modules, same names.
    tiny = ModelConfig(vocab_size=1, dim=2, n_layers=n_layers, n_heads=1, n_kv_heads=1, ffn_dim=1, max_seq_len=1)
    return tuple(Transformer(tiny, seed=0).snapshot_axes().items())


def names(model_or_config=None) -> list[str]:
    """The registry's names in forward order (default: the default config)."""
    return list(registry(model_or_config))


def axis_sizes(config: ModelConfig, n: int, m: int) -> dict[str, int]:
    """The size of every axis letter for one forward of n new queries against m keys."""
    return {"n": n, "m": m, "H": config.n_heads, "G": config.n_kv_heads, "D": config.head_dim,
            "C": config.dim, "V": config.vocab_size, "F": config.ffn_dim}


def snapshot_shape(name: str, config: ModelConfig | None = None, n: int = 1, m: int | None = None) -> tuple:
    """The shape (batch removed) of snapshot ``name`` for n new queries against m keys (default m = n)."""
    config = ModelConfig() if config is None else config
    axes = registry(config)
    if name not in axes:
        raise ValueError(f"no snapshot is named {name!r}; names are {_summary(axes)}")
    sizes = axis_sizes(config, n, n if m is None else m)
    return tuple(sizes[a] for a in axes[name])


def _summary(axes) -> str:
    """Registry names with layer numbers folded: 'embed, layers.{0..3}.resid_pre, ...'."""
    layers = sorted({int(k.split(".")[1]) for k in axes if k.startswith("layers.")})
    span = f"layers.{{0..{layers[-1]}}}." if layers else "layers.{i}."
    seen = dict.fromkeys(re.sub(r"^layers\.\d+\.", span, k) for k in axes)
    return ", ".join(seen)


def _resolve(pattern, axes: dict, layer=None) -> list[str]:
    """Registry names matched by one pattern, in forward order.

    A pattern is a full name (``layers.2.attn.softmax``), a glob
    (``layers.2.attn.*``) or a layer-local name/glob (``attn.softmax``: every
    layer, or only ``layer`` when given).
    """
    if not isinstance(pattern, str):
        raise TypeError(f"a snapshot name must be a str, got {type(pattern).__name__}")
    if layer is None and pattern in axes:
        return [pattern]
    n_layers = len({k.split(".")[1] for k in axes if k.startswith("layers.")})
    if layer is not None:
        if isinstance(layer, bool) or not isinstance(layer, (int, np.integer)) or not 0 <= layer < n_layers:
            raise ValueError(f"layer {layer!r} does not exist: the model has layers 0..{n_layers - 1}")
        if not pattern.startswith("layers."):
            pattern = f"layers.{layer}.{pattern}"
        elif not pattern.startswith(f"layers.{layer}."):
            raise ValueError(f"{pattern!r} names another layer than layer={layer}")
    found = [k for k in axes if fnmatch.fnmatchcase(k, pattern)]
    if not found and not pattern.startswith("layers."):
        found = [k for k in axes if fnmatch.fnmatchcase(k, "layers.*." + pattern)]
    if not found:
        bad = re.match(r"layers\.(\d+)\.", pattern)
        if bad and int(bad.group(1)) >= n_layers:
            raise ValueError(f"layer {int(bad.group(1))} in {pattern!r} does not exist: "
                             f"the model has layers 0..{n_layers - 1}")
        raise ValueError(f"no snapshot is named {pattern!r}; names are {_summary(axes)}")
    return found


def _resolve_all(patterns, axes: dict) -> list[str]:
    if isinstance(patterns, str):
        patterns = [patterns]
    try:
        patterns = list(patterns)
    except TypeError:
        raise TypeError(f"names must be a str or a list of str, got {type(patterns).__name__}") from None
    chosen = set()
    for p in patterns:
        chosen.update(_resolve(p, axes))
    return [k for k in axes if k in chosen]


def _head_axis(name: str, axes: tuple) -> int | None:
    for letter in ("H", "G"):
        if letter in axes:
            return axes.index(letter)
    return None


def _storage_dtype(dtype):
    if dtype is None:
        return None
    try:
        dt = np.dtype(dtype)
    except TypeError:
        raise TypeError(f"dtype must be one of {STORAGE_DTYPES}, got {dtype!r}") from None
    if dt.name not in STORAGE_DTYPES:
        raise ValueError(f"dtype must be one of {STORAGE_DTYPES}, got {dt.name!r}")
    return dt


def _index(value, what: str, size: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{what} must be an int, got {value!r}")
    if value < 0 or (size is not None and value >= size):
        where = f"0..{size - 1}" if size else "an int >= 0"
        raise ValueError(f"{what}={value} is out of range: expected {where}")
    return int(value)


# ----------------------------------------------------------------------------
# Recorded data
# ----------------------------------------------------------------------------

@dataclass
class Step:
    """One forward pass: n new queries at positions start .. start+n-1, against m keys.

    ``tokens`` (n,) are the kept batch row's input ids; ``values`` and
    ``grads`` map snapshot names to arrays (batch removed, read-only).
    """

    index: int
    n: int
    m: int
    start: int
    tokens: np.ndarray
    values: dict = field(default_factory=dict)
    grads: dict = field(default_factory=dict)


class Trace:
    """Snapshots (and gradients) of one or more forward passes, keyed by step and name.

    Read with :meth:`get` / :meth:`grad`; export with :meth:`save`.
    """

    def __init__(self, config: ModelConfig, axes: dict, recorded: list[str], steps: list[Step],
                 batch: int = 0, dtype: str | None = None, interventions: list[str] | None = None):
        self.config = config
        self.axes = dict(axes)             # the whole registry
        self._names = list(recorded)
        self.steps = steps
        self.batch = batch
        self.dtype = dtype
        self.interventions = list(interventions or [])
        self.loss: float | None = None

    def __repr__(self) -> str:
        return f"Trace({len(self._names)} names, {len(self.steps)} step(s), batch row {self.batch})"

    def names(self) -> list[str]:
        """The recorded names, in forward order."""
        return list(self._names)

    @property
    def tokens(self) -> np.ndarray:
        """The kept row's token ids of all steps, in order: (start of last step + its n,)."""
        if not self.steps:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([s.tokens for s in self.steps])

    def name(self, name: str, layer=None) -> str:
        """The full name of ``name`` (with ``layer`` for a layer-local name); ValueError if unknown."""
        found = _resolve(name, self.axes, layer)
        if len(found) != 1:
            raise ValueError(f"{name!r} matches {len(found)} snapshots ({found[0]}, ...); "
                             f"pass layer= or a full name")
        return found[0]

    def step(self, step=None) -> Step:
        if step is None:
            if len(self.steps) != 1:
                raise ValueError(f"this trace has {len(self.steps)} steps: pass step=0..{len(self.steps) - 1}")
            return self.steps[0]
        if isinstance(step, bool) or not isinstance(step, (int, np.integer)):
            raise TypeError(f"step must be an int, got {step!r}")
        if not -len(self.steps) <= step < len(self.steps):
            raise ValueError(f"step={step} is out of range: this trace has {len(self.steps)} step(s)")
        return self.steps[step]

    def get(self, name: str, layer=None, head=None, step=None) -> np.ndarray:
        """The snapshot ``name`` (batch removed), optionally one ``head`` of it.

        ``name`` is a full name or a layer-local one with ``layer``. ``head``
        indexes the snapshot's own head axis: a query head (H) for q, rope_q,
        scores, softmax, mix; a key/value head (G) for k, v, rope_k, cache_k,
        cache_v. ``step`` picks the forward (required when there are several).
        """
        return self._read(name, layer, head, step, grads=False)

    def grad(self, name: str, layer=None, head=None, step=None) -> np.ndarray:
        """``d loss / d snapshot`` for ``name``, with the same selection as :meth:`get`."""
        return self._read(name, layer, head, step, grads=True)

    def _read(self, name, layer, head, step, grads: bool) -> np.ndarray:
        full = self.name(name, layer)
        s = self.step(step)
        store = s.grads if grads else s.values
        if full not in store:
            if full not in self._names:
                raise ValueError(f"{full!r} was not recorded; this trace holds {self._names or 'nothing'} "
                                 f"(pass names=None to record everything)")
            if grads and full.endswith("attn.mask"):
                raise ValueError(f"{full!r} is boolean: it has no gradient")
            if grads:
                raise ValueError(f"no gradient for {full!r} at step {s.index}: run the backward pass "
                                 f"inside the tracer's with-block, outside no_grad")
            raise ValueError(f"{full!r} was not recorded at step {s.index}")
        out = store[full]
        if head is not None:
            axis = _head_axis(full, self.axes[full])
            if axis is None:
                raise ValueError(f"{full!r} has no head axis (axes {', '.join(self.axes[full])})")
            out = out.take(_index(head, "head", out.shape[axis]), axis=axis)
        return out

    def shape(self, name: str, layer=None, step=None) -> tuple:
        full = self.name(name, layer)
        s = self.step(step)
        return tuple(axis_sizes(self.config, s.n, s.m)[a] for a in self.axes[full])

    # -- export ----------------------------------------------------------------
    def manifest(self) -> dict:
        """The JSON description stored in a trace file (see :func:`validate_manifest`)."""
        steps = []
        for s in self.steps:
            sizes = axis_sizes(self.config, s.n, s.m)
            steps.append({
                "n": s.n, "m": s.m, "start": s.start, "tokens": [int(t) for t in s.tokens],
                "shapes": {k: [sizes[a] for a in self.axes[k]] for k in self._names if k in s.values},
                "grads": [k for k in self._names if k in s.grads],
            })
        return {
            "format": FORMAT, "version": VERSION, "config": self.config.to_dict(),
            "batch": self.batch, "dtype": self.dtype or _dtype_of(self),
            "names": list(self._names), "axes": {k: list(self.axes[k]) for k in self._names},
            "interventions": list(self.interventions), "steps": steps,
        }

    def save(self, path) -> None:
        """Write the trace to ``path`` (a ``.npz``: ``manifest.json`` plus one ``.npy`` per array), atomically.

        Array members: ``values/{step}/{name}.npy`` and ``grads/{step}/{name}.npy``.
        """
        manifest = self.manifest()
        try:
            with atomic_path(path) as tmp:
                with zipfile.ZipFile(tmp, "w", compression=zipfile.ZIP_STORED, allowZip64=True) as z:
                    z.writestr("manifest.json", json.dumps(manifest, indent=1))
                    for s in self.steps:
                        for kind, store in (("values", s.values), ("grads", s.grads)):
                            for k in self._names:
                                if k in store:
                                    with z.open(f"{kind}/{s.index}/{k}.npy", "w", force_zip64=True) as f:
                                        np.lib.format.write_array(f, np.ascontiguousarray(store[k]),
                                                                  allow_pickle=False)
        except OSError as e:
            raise ValueError(f"cannot write trace {str(path)!r}: {e.strerror or e}") from None


def _dtype_of(trace: Trace) -> str:
    for s in trace.steps:
        for v in s.values.values():
            if v.dtype != np.bool_:
                return v.dtype.name
    return "float32"


# ----------------------------------------------------------------------------
# The tracer
# ----------------------------------------------------------------------------

class Tracer:
    """Records snapshots (and their gradients) of ``model`` while the ``with`` block runs.

    ``names``: None records every snapshot; otherwise a name, glob or
    layer-local name, or a list of them (each must match some snapshot).
    ``batch``: which batch row to keep. ``dtype``: storage dtype (float16,
    float32 or float64; default: the model's). ``interventions``: edits applied
    during every forward (see :class:`Intervention`).

    >>> from glassllm.nn import Transformer
    >>> model = Transformer(ModelConfig(), seed=0)
    >>> with Tracer(model, names="logits") as tracer:
    ...     _ = model([1, 2, 3])
    ...     _ = model([4])
    >>> [(s.n, s.m) for s in tracer.trace.steps]
    [(3, 3), (1, 1)]
    """

    def __init__(self, model, names=None, *, batch: int = 0, dtype=None, interventions=()):
        self.model = model
        self.config = model.config
        self.axes = registry(model)
        self.selected = set(self.axes) if names is None else set(_resolve_all(names, self.axes))
        self.batch = _index(batch, "batch")
        self.dtype = _storage_dtype(dtype)
        if isinstance(interventions, Intervention):
            interventions = [interventions]
        self.interventions = list(interventions)
        self._edits: dict[str, list] = {}
        for iv in self.interventions:
            if not isinstance(iv, Intervention):
                raise TypeError(f"interventions must be Intervention objects, got {type(iv).__name__}")
            for k in iv.bind(self.axes, self.config):
                self._edits.setdefault(k, []).append(iv)
        self._active = frozenset(self.selected | set(self._edits))
        self.steps: list[Step] = []
        self._live: list[tuple[Step, str, Tensor]] = []

    # -- the protocol the model calls -----------------------------------------
    def begin_forward(self, n: int, m: int, start: int, tokens) -> None:
        """A forward of n new tokens against m keys begins: open a new step."""
        tokens = np.asarray(tokens)
        if self.batch >= tokens.shape[0]:
            raise ValueError(f"batch={self.batch} is out of range: the forward has batch size {tokens.shape[0]}")
        self.steps.append(Step(len(self.steps), int(n), int(m), int(start), tokens[self.batch].copy()))

    def wants(self, names) -> bool:
        """Does any of these full names need to be seen (recorded or edited)?"""
        active = self._active
        return any(k in active for k in names)

    def record(self, name: str, t: Tensor) -> Tensor:
        """Apply the interventions on ``name``, store it if selected; return what flows on."""
        if name not in self._active:
            return t
        if not self.steps:
            raise ValueError(f"snapshot {name!r} arrived outside a model forward (call the Transformer)")
        step = self.steps[-1]
        for iv in self._edits.get(name, ()):
            new = iv.apply(name, t, step)
            if not isinstance(new, Tensor) or new.shape != t.shape:
                got = new.shape if isinstance(new, Tensor) else type(new).__name__
                raise ValueError(f"{iv!r} returned {got} for {name!r}, expected a Tensor of shape {t.shape}")
            t = new
        if name in self.selected:
            if ag.is_grad_enabled() and t.requires_grad:
                # An identity node of its own, so that this name gets its own gradient.
                t = ag.reshape(t, t.shape).retain_grad()
                self._live.append((step, name, t))
            step.values[name] = self._keep(name, t.data)
        return t

    def _keep(self, name: str, data: np.ndarray, copy: bool = False) -> np.ndarray:
        """The kept batch row, cast to the storage dtype, read-only."""
        row = data[self.batch]
        target = row.dtype if (self.dtype is None or row.dtype == np.bool_) else self.dtype
        if copy or data.shape[0] > 1 or target != row.dtype or name.endswith(_BUFFER_VIEWS):
            row = row.astype(target, copy=True)
        else:
            row = row.view()  # a fresh array nothing writes to again: no copy needed
        row.flags.writeable = False
        return row

    # -- context manager --------------------------------------------------------
    def __enter__(self) -> "Tracer":
        if getattr(self.model, "_tracer", None) is not None:
            raise ValueError("this model already has a tracer attached; exit that one's with-block first")
        self.model.set_tracer(self)
        return self

    def __exit__(self, *exc) -> bool:
        self.model.set_tracer(None)
        self.collect_grads()
        return False

    def collect_grads(self) -> None:
        """Store the gradients a backward pass left on the recorded snapshots.

        Called on exit. If no backward ran, nothing is stored. A snapshot the
        loss does not depend on (``probs`` when the loss is computed from the
        logits) gets a zero gradient.
        """
        live, self._live = self._live, []
        if not any(t.grad is not None for _, _, t in live):
            self._live = live  # maybe backward has not run yet
            return
        for step, name, t in live:
            g = t.grad if t.grad is not None else np.zeros_like(t.data)
            step.grads[name] = self._keep(name, g, copy=True)
            t.grad = None

    @property
    def trace(self) -> Trace:
        """What has been recorded so far."""
        dtype = None if self.dtype is None else self.dtype.name
        return Trace(self.config, self.axes, [k for k in self.axes if k in self.selected], self.steps,
                     self.batch, dtype, [repr(iv) for iv in self.interventions])

    def names(self) -> list[str]:
        """The names this tracer records, in forward order."""
        return [k for k in self.axes if k in self.selected]


def trace(model, tokens, names=None, *, targets=None, cache=None, batch: int = 0, dtype=None,
          interventions=()) -> Trace:
    """Run one forward of ``tokens`` (B, n) or (n,) under a :class:`Tracer` and return its :class:`Trace`.

    With ``targets`` (same shape as tokens), the mean cross-entropy is
    back-propagated too, so every snapshot gets its gradient (``trace.loss``
    holds the loss). The parameters' ``.grad`` are left as they were.
    """
    tracer = Tracer(model, names, batch=batch, dtype=dtype, interventions=interventions)
    if targets is None:
        with ag.no_grad(), tracer:
            model(tokens, cache)
        return tracer.trace
    params = model.parameters()
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        with tracer:
            logits = model(tokens, cache)
            targets = np.asarray(targets)
            loss = ag.cross_entropy(logits, targets.reshape(logits.shape[:-1]) if targets.ndim == 1 else targets)
            loss.backward()
    finally:
        for p, g in zip(params, saved):
            p.grad = g
    out = tracer.trace
    out.loss = float(loss.item())
    return out


# ----------------------------------------------------------------------------
# Interventions
# ----------------------------------------------------------------------------

def _constant(data: np.ndarray, like: Tensor) -> Tensor:
    """New values for a snapshot: a constant, but a leaf that still receives its gradient."""
    return Tensor(data, requires_grad=bool(ag.is_grad_enabled() and like.requires_grad))


def _layers(layers, n_layers: int) -> list[int]:
    if layers is None:
        return list(range(n_layers))
    if isinstance(layers, (int, np.integer)) and not isinstance(layers, bool):
        layers = [layers]
    return [_index(i, "layer", n_layers) for i in layers]


class Intervention:
    """Changes snapshots during the forward; the model goes on with the new value.

    Subclasses implement ``bind(axes, config) -> list of full names`` (called
    once by the :class:`Tracer`, validating every argument) and ``apply(name,
    t, step) -> Tensor`` (same shape; the batch axis is still there).
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
        return _resolve_all(self.patterns, axes)

    def apply(self, name, t, step):
        rows = []
        for b in range(t.shape[0]):
            new = np.asarray(self.fn(np.array(t.data[b])))
            if new.shape != t.shape[1:]:
                raise ValueError(f"Edit of {name!r}: fn returned shape {new.shape}, expected {t.shape[1:]}")
            rows.append(new)
        return _constant(np.stack(rows).astype(t.dtype, copy=False), t)

    def __repr__(self):
        return f"Edit({self.patterns!r}, fn={getattr(self.fn, '__name__', type(self.fn).__name__)})"


class ZeroAblate(Intervention):
    """Zero head ``head`` of layer ``layer``: its slice of ``attn.mix`` (the per-head output before W_O)."""

    def __init__(self, layer: int, head: int):
        self.layer, self.head = layer, head

    def bind(self, axes, config):
        self.layer = _index(self.layer, "layer", config.n_layers)
        self.head = _index(self.head, "head", config.n_heads)
        return [f"layers.{self.layer}.attn.mix"]

    def apply(self, name, t, step):
        keep = np.ones((1, t.shape[1], 1, 1), dtype=t.dtype)            # (1, H, 1, 1)
        keep[0, self.head] = 0
        return t * keep                                                  # (B, H, n, D)

    def __repr__(self):
        return f"ZeroAblate(layer={self.layer}, head={self.head})"


class MeanAblate(Intervention):
    """Replace head ``head`` of layer ``layer`` (its ``attn.mix`` slice) by a mean output.

    ``mean``: a (D,) array, or a :class:`Trace` of reference text that recorded
    ``layers.{layer}.attn.mix``: the mean of that head over all its positions
    and steps. (A mean over the current forward's own positions would let
    early positions see later ones, so it is not offered.)
    """

    def __init__(self, layer: int, head: int, mean):
        self.layer, self.head, self.mean = layer, head, mean

    def bind(self, axes, config):
        self.layer = _index(self.layer, "layer", config.n_layers)
        self.head = _index(self.head, "head", config.n_heads)
        if isinstance(self.mean, Trace):
            rows = [self.mean.get("attn.mix", layer=self.layer, head=self.head, step=s.index)
                    for s in self.mean.steps]                            # [(n_s, D)]
            if not rows:
                raise ValueError("MeanAblate: the reference trace has no steps")
            self.mean = np.concatenate(rows).astype(np.float64).mean(axis=0)  # (D,)
        mean = np.asarray(self.mean, dtype=np.float64)
        if mean.shape != (config.head_dim,) or not np.all(np.isfinite(mean)):
            raise ValueError(f"MeanAblate: mean must be {config.head_dim} finite numbers, got shape {mean.shape}")
        self.mean = mean
        return [f"layers.{self.layer}.attn.mix"]

    def apply(self, name, t, step):
        H = t.shape[1]
        keep = np.ones((1, H, 1, 1), dtype=t.dtype)                      # (1, H, 1, 1)
        keep[0, self.head] = 0
        fill = np.zeros((1, H, 1, t.shape[3]), dtype=t.dtype)            # (1, H, 1, D)
        fill[0, self.head, 0] = self.mean
        return t * keep + fill                                           # (B, H, n, D)

    def __repr__(self):
        return f"MeanAblate(layer={self.layer}, head={self.head})"


class Patch(Intervention):
    """Set snapshot(s) ``names`` to the values another run recorded (activation patching).

    ``source``: a :class:`Trace` that recorded those names, or an array of
    the snapshot's shape (batch removed) for a single name. The source step
    defaults to the current step's index. ``positions``: indices along the
    snapshot's n axis to patch (default: all); the others keep their values
    (and their gradient). Every batch row gets the same patched values.
    """

    def __init__(self, names, source, step=None, positions=None):
        if not isinstance(source, Trace):
            source = np.asarray(source)
        self.patterns, self.source, self.source_step = names, source, step
        self.positions = None if positions is None else np.atleast_1d(np.asarray(positions))
        if self.positions is not None and self.positions.dtype.kind not in "iu":
            raise TypeError(f"Patch positions must be ints, got {positions!r}")

    def bind(self, axes, config):
        found = _resolve_all(self.patterns, axes)
        if not isinstance(self.source, Trace) and len(found) != 1:
            raise ValueError(f"Patch with an array needs exactly one name; {self.patterns!r} matches {len(found)}")
        if isinstance(self.source, Trace):
            missing = [k for k in found if k not in self.source.names()]
            if missing:
                raise ValueError(f"Patch: the source trace did not record {missing[0]!r}")
        self.axes = {k: axes[k] for k in found}
        return found

    def apply(self, name, t, step):
        if isinstance(self.source, Trace):
            src_step = step.index if self.source_step is None else self.source_step
            value = self.source.get(name, step=src_step)
        else:
            value = self.source
        if value.shape != t.shape[1:]:
            raise ValueError(f"Patch of {name!r}: the source has shape {value.shape}, this forward has {t.shape[1:]}")
        value = np.broadcast_to(value.astype(t.dtype), t.shape)
        if self.positions is None:
            return _constant(np.array(value), t)
        axis = 1 + self.axes[name].index("n") if "n" in self.axes[name] else None
        if axis is None:
            raise ValueError(f"Patch positions need an n axis; {name!r} has axes {self.axes[name]}")
        pos = self.positions
        if np.any((pos < -t.shape[axis]) | (pos >= t.shape[axis])):
            raise ValueError(f"Patch positions {pos.tolist()} out of range for n={t.shape[axis]}")
        sel = np.zeros(t.shape[axis], dtype=bool)
        sel[pos] = True
        sel = sel.reshape([-1 if i == axis else 1 for i in range(t.ndim)])  # broadcast along the n axis
        if t.dtype == np.bool_:
            return Tensor(np.where(sel, value, t.data))
        return t * (~sel).astype(t.dtype) + np.where(sel, value, 0).astype(t.dtype)

    def __repr__(self):
        src = "Trace" if isinstance(self.source, Trace) else f"array{self.source.shape}"
        pos = "" if self.positions is None else f", positions={self.positions.tolist()}"
        return f"Patch({self.patterns!r}, source={src}{pos})"


class MaskOff(Intervention):
    """Switch off the causal mask of ``layers`` (default: all): every query sees every key, future included.

    (It also lifts a left-padding mask.) The spec's mask experiment.
    """

    def __init__(self, layers=None):
        self.layers = layers

    def bind(self, axes, config):
        self.layers = _layers(self.layers, config.n_layers)
        return [f"layers.{i}.attn.mask" for i in self.layers]

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
        self.temperature, self.layers, self.heads = float(temperature), layers, heads

    def bind(self, axes, config):
        self.layers = _layers(self.layers, config.n_layers)
        if self.heads is not None:
            heads = [self.heads] if isinstance(self.heads, (int, np.integer)) else self.heads
            self.heads = [_index(h, "head", config.n_heads) for h in heads]
        return [f"layers.{i}.attn.scores" for i in self.layers]

    def apply(self, name, t, step):
        factor = np.ones((1, t.shape[1], 1, 1), dtype=t.dtype)          # (1, H, 1, 1)
        factor[0, self.heads if self.heads is not None else slice(None)] = 1.0 / self.temperature
        return t * factor                                                # (B, H, n, m)

    def __repr__(self):
        return f"Temperature({self.temperature}, layers={self.layers}, heads={self.heads})"


# ----------------------------------------------------------------------------
# Loading a trace file
# ----------------------------------------------------------------------------

def _fail(msg: str):
    raise ValueError(f"trace manifest: {msg}")


def _is_int(x) -> bool:
    return isinstance(x, int) and not isinstance(x, bool)


def validate_manifest(manifest) -> dict:
    """Check a trace manifest field by field; return it. Raises ValueError naming the first bad field.

    Fields: ``format`` ("glassllm-trace"), ``version`` (1), ``config`` (a
    ModelConfig dict), ``batch`` (int >= 0), ``dtype`` (float16/32/64),
    ``names`` (registry names), ``axes`` ({name: axis letters}, as the
    registry says), ``interventions`` (strings) and ``steps``: a list of
    {``n``, ``m``, ``start``, ``tokens`` (n ids), ``shapes`` ({name: shape}),
    ``grads`` (names)} with m = start + n.
    """
    if not isinstance(manifest, dict):
        _fail(f"expected a JSON object, got {type(manifest).__name__}")
    expected = {"format", "version", "config", "batch", "dtype", "names", "axes", "interventions", "steps"}
    if set(manifest) != expected:
        extra, missing = sorted(set(manifest) - expected), sorted(expected - set(manifest))
        _fail(f"missing field {missing[0]!r}" if missing else f"unexpected field {extra[0]!r}")
    if manifest["format"] != FORMAT:
        _fail(f"format is {manifest['format']!r}, expected {FORMAT!r}")
    if not _is_int(manifest["version"]) or manifest["version"] != VERSION:
        _fail(f"version is {manifest['version']!r}; this glassllm reads version {VERSION}")
    try:
        config = ModelConfig.from_dict(manifest["config"])
    except (TypeError, ValueError) as e:
        _fail(f"bad config: {e}")
    if config.n_layers > MAX_LAYERS:
        _fail(f"config has {config.n_layers} layers, more than the limit {MAX_LAYERS}")
    if not _is_int(manifest["batch"]) or manifest["batch"] < 0:
        _fail(f"batch must be an int >= 0, got {manifest['batch']!r}")
    if manifest["dtype"] not in STORAGE_DTYPES:
        _fail(f"dtype must be one of {STORAGE_DTYPES}, got {manifest['dtype']!r}")
    axes = registry(config)
    recorded = manifest["names"]
    if not isinstance(recorded, list) or not all(isinstance(k, str) for k in recorded):
        _fail("names must be a list of strings")
    for k in recorded:
        if k not in axes:
            _fail(f"unknown snapshot name {k!r}")
    if len(set(recorded)) != len(recorded):
        _fail("names has duplicates")
    if not isinstance(manifest["axes"], dict) or set(manifest["axes"]) != set(recorded):
        _fail("axes must map exactly the recorded names to their axes")
    for k, a in manifest["axes"].items():
        if a != list(axes[k]):
            _fail(f"axes of {k!r} are {a!r}, expected {list(axes[k])}")
    ivs = manifest["interventions"]
    if not isinstance(ivs, list) or not all(isinstance(s, str) for s in ivs):
        _fail("interventions must be a list of strings")
    steps = manifest["steps"]
    if not isinstance(steps, list):
        _fail("steps must be a list")
    step_fields = {"n", "m", "start", "tokens", "shapes", "grads"}
    for i, s in enumerate(steps):
        if not isinstance(s, dict) or set(s) != step_fields:
            _fail(f"step {i} must be an object with fields {sorted(step_fields)}")
        n, m, start = s["n"], s["m"], s["start"]
        if not (_is_int(n) and _is_int(m) and _is_int(start) and n >= 1 and start >= 0 and m == start + n
                and m <= config.max_seq_len):
            _fail(f"step {i}: need ints n >= 1, start >= 0, m = start + n <= {config.max_seq_len}; "
                  f"got n={n!r}, m={m!r}, start={start!r}")
        tokens = s["tokens"]
        if (not isinstance(tokens, list) or len(tokens) != n
                or not all(_is_int(t) and 0 <= t < config.vocab_size for t in tokens)):
            _fail(f"step {i}: tokens must be {n} ids in [0, {config.vocab_size})")
        shapes = s["shapes"]
        if not isinstance(shapes, dict) or not set(shapes) <= set(recorded):
            _fail(f"step {i}: shapes must map recorded names to shapes")
        sizes = axis_sizes(config, n, m)
        for k, shape in shapes.items():
            if shape != [sizes[a] for a in axes[k]]:
                _fail(f"step {i}: shape of {k!r} is {shape!r}, expected {[sizes[a] for a in axes[k]]}")
        grads = s["grads"]
        if not isinstance(grads, list) or not all(isinstance(k, str) and k in shapes for k in grads) \
                or len(set(grads)) != len(grads):
            _fail(f"step {i}: grads must list recorded names that have values")
        if any(k.endswith("attn.mask") for k in grads):
            _fail(f"step {i}: a mask has no gradient")
    return manifest


def load_trace(path) -> Trace:
    """Read a trace file written by :meth:`Trace.save`; every field and array is checked.

    Raises ValueError (one line, naming the file) for anything malformed.
    """
    path = Path(path)
    if not path.is_file():
        raise ValueError(f"trace file {str(path)!r} does not exist or is not a file")
    try:
        with zipfile.ZipFile(path) as z:
            return _read_trace(z, str(path))
    except zipfile.BadZipFile as e:
        raise ValueError(f"{str(path)!r} is not a trace file: {e}") from None
    except (OSError, EOFError, zipfile.LargeZipFile, NotImplementedError, RuntimeError) as e:
        raise ValueError(f"{str(path)!r}: cannot read: {e}") from None


def _read_trace(z: zipfile.ZipFile, where: str) -> Trace:
    members = {info.filename: info for info in z.infolist()}
    info = members.get("manifest.json")
    if info is None:
        raise ValueError(f"{where!r} is not a trace file: it has no manifest.json")
    if info.file_size > MAX_MANIFEST_BYTES:
        raise ValueError(f"{where!r}: manifest.json is {info.file_size} bytes, larger than the limit")
    try:
        manifest = json.loads(z.read(info).decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError) as e:
        raise ValueError(f"{where!r}: manifest.json is not valid JSON: {e}") from None
    try:
        validate_manifest(manifest)
    except ValueError as e:
        raise ValueError(f"{where!r}: {e}") from None

    config = ModelConfig.from_dict(manifest["config"])
    dtype = np.dtype(manifest["dtype"])
    expected = {"manifest.json"}
    steps = []
    for i, s in enumerate(manifest["steps"]):
        step = Step(i, s["n"], s["m"], s["start"], np.array(s["tokens"], dtype=np.int64))
        for kind, names_ in (("values", list(s["shapes"])), ("grads", s["grads"])):
            for k in names_:
                member = f"{kind}/{i}/{k}.npy"
                expected.add(member)
                if member not in members:
                    raise ValueError(f"{where!r}: missing array {member!r}")
                want = np.dtype(bool) if (kind == "values" and k.endswith("attn.mask")) else dtype
                arr = _read_npy(z, members[member], tuple(s["shapes"][k]), want, where)
                (step.values if kind == "values" else step.grads)[k] = arr
        steps.append(step)
    extra = sorted(set(members) - expected)
    if extra:
        raise ValueError(f"{where!r}: unexpected member {extra[0]!r}")
    return Trace(config, registry(config), manifest["names"], steps, manifest["batch"], manifest["dtype"],
                 manifest["interventions"])


def _read_npy(z: zipfile.ZipFile, info: zipfile.ZipInfo, shape: tuple, dtype: np.dtype, where: str) -> np.ndarray:
    """One .npy member, its header checked against the manifest before any data is read."""
    fmt = np.lib.format
    nbytes = math.prod(shape) * dtype.itemsize
    # The declared size bounds what a read can return; refuse a member too small for
    # the manifest's shape, or one that inflates absurdly (a zip bomb).
    if info.file_size < nbytes or info.file_size > 1024 * max(info.compress_size, 1) + 65536:
        raise ValueError(f"{where!r}: {info.filename!r} is {info.file_size} bytes, "
                         f"which cannot hold {dtype} {shape}")
    with z.open(info) as f:
        try:
            version = fmt.read_magic(f)
            if version == (1, 0):
                got_shape, fortran, got_dtype = fmt.read_array_header_1_0(f)
            elif version == (2, 0):
                got_shape, fortran, got_dtype = fmt.read_array_header_2_0(f)
            else:
                raise ValueError(f"npy version {version}")
        except ValueError as e:
            raise ValueError(f"{where!r}: {info.filename!r} is not a valid .npy array: {e}") from None
        if tuple(got_shape) != shape or got_dtype != dtype or fortran:
            raise ValueError(f"{where!r}: {info.filename!r} holds {got_dtype} {tuple(got_shape)}, "
                             f"the manifest says {dtype} {shape}")
        data = f.read(nbytes + 1)
    if len(data) != nbytes:
        raise ValueError(f"{where!r}: {info.filename!r} has {len(data)} data bytes, expected {nbytes}")
    arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    arr.flags.writeable = False
    return arr


# ----------------------------------------------------------------------------
# The documented table (docs/snapshots.md)
# ----------------------------------------------------------------------------

# What each snapshot is; keys are names with the layer number removed.
DESCRIPTIONS = {
    "embed": "token embedding rows: the residual stream entering layer 0",
    "resid_pre": "residual stream entering the block",
    "attn_norm.in": "input of the attention RMSNorm (same values as resid_pre; its gradient is the norm's share)",
    "attn_norm.rms": "root mean square of each position's vector, `sqrt(mean(in**2) + eps)`",
    "attn_norm.out": "normalised input of attention: `in / rms * weight`",
    "attn.q": "queries: `attn_norm.out @ wq.T`, split into heads",
    "attn.k": "keys: `attn_norm.out @ wk.T`, one per key/value head",
    "attn.v": "values: `attn_norm.out @ wv.T`, one per key/value head",
    "attn.rope_q": "queries rotated by their absolute positions (RoPE, interleaved pairs)",
    "attn.rope_k": "keys rotated by their absolute positions",
    "attn.cache_k": "all m keys the queries read: the cached ones followed by rope_k",
    "attn.cache_v": "all m values the queries read: the cached ones followed by v",
    "attn.scores": "`rope_q @ cache_k.T / sqrt(D)`, each K/V head serving its query heads; before the mask",
    "attn.mask": "True where key j is in query i's future (forbidden)",
    "attn.softmax": "attention weights: softmax over keys of the masked scores; rows sum to 1",
    "attn.mix": "per-head outputs: `softmax @ cache_v`, before the output projection",
    "attn.out": "heads concatenated and projected: `concat(mix) @ wo.T`",
    "resid_mid": "residual stream after attention: `resid_pre + attn.out`",
    "mlp_norm.in": "input of the MLP RMSNorm (same values as resid_mid; its gradient is the norm's share)",
    "mlp_norm.rms": "root mean square of each position's vector",
    "mlp_norm.out": "normalised input of the MLP",
    "mlp.gate": "gate pre-activation: `mlp_norm.out @ w1.T`",
    "mlp.up": "up projection: `mlp_norm.out @ w3.T`",
    "mlp.act": "`silu(gate) = gate * sigmoid(gate)`",
    "mlp.prod": "`act * up`, the SwiGLU hidden vector",
    "mlp.out": "down projection: `prod @ w2.T`",
    "resid_post": "residual stream after the MLP: `resid_mid + mlp.out`",
    "norm.in": "input of the final RMSNorm (the last block's output)",
    "norm.rms": "root mean square of each position's vector",
    "norm.out": "normalised final residual stream",
    "logits": "next-token scores over the vocabulary",
    "probs": "softmax of the logits: next-token probabilities",
}

DOC_BEGIN = "<!-- BEGIN GENERATED: python -m glassllm.trace docs/snapshots.md -->"
DOC_END = "<!-- END GENERATED -->"


def snapshot_table(config: ModelConfig | None = None) -> str:
    """The Markdown table of every snapshot: name, axes, shape for ``config`` (n, m symbolic), meaning."""
    config = ModelConfig() if config is None else config
    sizes = {**axis_sizes(config, 0, 0), "n": "n", "m": "m"}
    rows = ["| name | axes | shape | what it is |", "|---|---|---|---|"]
    seen = set()
    for name, axes in registry(config).items():
        generic = re.sub(r"^layers\.\d+\.", "layers.{i}.", name)
        if generic in seen:
            continue
        seen.add(generic)
        local = generic.removeprefix("layers.{i}.")
        rows.append(f"| `{generic}` | {_tuple(axes)} | {_tuple(sizes[a] for a in axes)} | {DESCRIPTIONS[local]} |")
    return "\n".join(rows) + "\n"


def _tuple(items) -> str:
    items = [str(i) for i in items]
    return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"


def write_snapshot_doc(path) -> None:
    """Replace the generated block of ``path`` (between the markers) by :func:`snapshot_table`."""
    from .checkpoint import atomic_write

    text = Path(path).read_text(encoding="utf-8")
    if DOC_BEGIN not in text or DOC_END not in text:
        raise ValueError(f"{str(path)!r} lacks the markers {DOC_BEGIN!r} ... {DOC_END!r}")
    head, rest = text.split(DOC_BEGIN, 1)
    _, tail = rest.split(DOC_END, 1)
    atomic_write(path, f"{head}{DOC_BEGIN}\n{snapshot_table()}{DOC_END}{tail}")


if __name__ == "__main__":
    import sys

    if len(sys.argv) != 2:
        print("usage: python -m glassllm.trace docs/snapshots.md", file=sys.stderr)
        sys.exit(2)
    try:
        write_snapshot_doc(sys.argv[1])
    except (ValueError, OSError) as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
