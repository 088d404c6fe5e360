"""Activation-patching sweeps: which cells of which snapshot carry the difference between two prompts.

Run the *corrupted* prompt, and put back, one cell at a time, the value that
snapshot had in the *clean* run; a metric of the output (by default the
logit difference between the clean and the corrupted run's next tokens at
the last position) says how much of the clean behaviour that one cell
restores. The cells:

* :func:`layer_position` -- one position of a snapshot (``resid_pre`` by
  default) in one layer: an (L, n) map;
* :func:`heads` -- one head (all positions) of a snapshot with a head axis
  (``attn.mix`` by default, the per-head output before W_O): (L, H);
* :func:`head_position` -- one head at one position: (L, H, n).

:func:`attribution` estimates all three at once, to first order, from one
forward and one backward pass of the corrupted prompt (and one forward of the
clean one): *attribution patching*, the gradient approximation of the sweeps.

These are TransformerLens' ``patching.get_act_patch_resid_pre``,
``get_act_patch_attn_head_out_all_pos`` and ``get_act_patch_attn_head_out_by_pos``.
Every cell of a layer is one row of a batch, so a layer costs one forward
(of at most ``max_batch`` rows at a time), not one forward per cell. Results
are :class:`~glassllm.trace.labelled.Labelled` arrays (``.plot()`` draws them)
whose ``baseline`` holds the metric of the clean and of the corrupted run.
"""

from __future__ import annotations

import numpy as np

from .. import autograd as ag
from ..checks import check_int
from ..autograd import Tensor
from .interventions import Intervention
from .labelled import Labelled
from .registry import head_axis, resolve
from .tracer import Tracer, parameter_grads_kept, trace


def logit_diff(answer: int, wrong: int, position: int = -1):
    """The metric ``logits[position, answer] - logits[position, wrong]``, one number per batch row.

    >>> metric = logit_diff(2, 0)
    >>> metric(np.array([[[1.0, 0.0, 3.0]]]))
    array([2.])
    """
    def metric(logits: np.ndarray) -> np.ndarray:
        return logits[:, position, answer] - logits[:, position, wrong]   # (B,)
    metric.__name__ = f"logit_diff({answer}, {wrong})"
    return metric


class _Cells(Intervention):
    """Batch row r of snapshot ``name`` takes ``source`` where ``sel[r]`` is True (no gradients)."""

    def __init__(self, name: str, source: np.ndarray, sel: np.ndarray):
        self.name, self.source, self.sel = name, source, sel

    def bind(self, axes, config):
        return [self.name]

    def apply(self, name, t, step):
        return Tensor(np.where(self.sel, self.source.astype(t.dtype), t.data))   # (B, ...)


def _check_pair(model, clean, corrupt):
    clean, corrupt = model.check_tokens(clean), model.check_tokens(corrupt)
    if clean.shape[0] != 1 or corrupt.shape[0] != 1:
        raise ValueError(f"patching compares one clean and one corrupted sequence, got batches of "
                         f"{clean.shape[0]} and {corrupt.shape[0]}")
    if clean.shape != corrupt.shape:
        raise ValueError(f"clean and corrupted prompts must have the same length to patch position by "
                         f"position, got {clean.shape[1]} and {corrupt.shape[1]} tokens")
    return clean[0], corrupt[0]


def _metric_of(metric, logits: np.ndarray) -> np.ndarray:
    """metric over a batch of logits (B, n, V): one number per row (calling it row by row if it gives one)."""
    out = np.asarray(metric(logits), dtype=np.float64)
    if out.shape == (len(logits),):
        return out
    if len(logits) == 1 and out.size == 1:
        return out.reshape(1)
    rows = [np.asarray(metric(logits[r:r + 1]), dtype=np.float64) for r in range(len(logits))]
    if any(r.size != 1 for r in rows):
        raise ValueError(f"metric must give one number per batch row of logits (B, n, V), got shape {out.shape}")
    return np.array([float(r.reshape(())) for r in rows])


def _default_metric(clean_logits: np.ndarray, corrupt_logits: np.ndarray):
    """logit_diff of the clean run's and the corrupted run's most likely next tokens at the last position."""
    answer, wrong = int(clean_logits[-1].argmax()), int(corrupt_logits[-1].argmax())
    if answer == wrong:
        raise ValueError(f"the clean and the corrupted prompt both predict token {answer} next, so the "
                         "default metric (their logit difference) is 0 everywhere; pass metric=")
    return logit_diff(answer, wrong)


def _positions(ids: np.ndarray, tokenizer) -> list:
    """Position labels: 0, 1, ... or, with a tokenizer, '0:piece', '1:piece', ..."""
    return list(range(len(ids))) if tokenizer is None else [
        f"{i}:{p}" for i, p in enumerate(tokenizer.pieces(ids.tolist()))]


class _Sweep:
    """The clean values of one snapshot in every layer, and the runs that patch them into the corrupted prompt."""

    def __init__(self, model, clean, corrupt, name: str, metric, max_batch: int):
        max_batch = check_int("max_batch", max_batch, low=1)
        self.model, self.max_batch = model, max_batch
        self.clean, self.corrupt = _check_pair(model, clean, corrupt)
        axes = model.snapshot_axes()
        self.L = model.config.n_layers
        if isinstance(name, str) and len(resolve(name, axes)) == 1:        # one layer's snapshot, not a kind
            raise ValueError(f"name must be layer-local (resid_pre, attn.mix, hook_resid_pre or a glob such as "
                             f"blocks.*.attn.hook_z): the sweep patches it in every layer; got {name!r}")
        self.names = [resolve(name, axes, layer=i)[0] for i in range(self.L)]
        self.axes = axes[self.names[0]]
        with ag.no_grad():
            source = trace(model, self.clean, names=self.names + ["logits"])
            plain = trace(model, self.corrupt, names=["logits"]).get("logits")
        self.source = {k: source.get(k) for k in self.names}
        self.metric = metric = _default_metric(source.get("logits"), plain) if metric is None else metric
        self.baseline = {"clean": float(_metric_of(metric, source.get("logits")[None])[0]),
                         "corrupt": float(_metric_of(metric, plain[None])[0])}

    def run(self, layer: int, sels: np.ndarray) -> np.ndarray:
        """The metric with cell r patched in row r: sels (R, *snapshot shape) bool -> (R,)."""
        name, out = self.names[layer], []
        for lo in range(0, len(sels), self.max_batch):
            sel = sels[lo: lo + self.max_batch]
            tokens = np.broadcast_to(self.corrupt, (len(sel), len(self.corrupt)))   # (R, n)
            with ag.no_grad(), Tracer(self.model, names=[], interventions=_Cells(name, self.source[name], sel)):
                logits = self.model(tokens).data                                        # (R, n, V)
            out.append(_metric_of(self.metric, logits))
        return np.concatenate(out)

    def result(self, values, dims, labels, what: str) -> Labelled:
        title = f"patching {what}: {getattr(self.metric, '__name__', 'metric')}"
        return Labelled(values, dims, labels, title, self.baseline)

    def positions(self, tokenizer) -> list:
        return _positions(self.clean, tokenizer)

    def head_axis(self) -> int:
        axis = head_axis(self.axes)
        if axis is None:
            raise ValueError(f"{self.names[0]!r} has no head axis (axes {', '.join(self.axes)}); "
                             "patch heads of attn.mix, attn.head_out, attn.softmax, attn.q, ...")
        return axis

    def shape(self, layer: int) -> tuple:
        return self.source[self.names[layer]].shape


def layer_position(model, clean, corrupt, *, name: str = "resid_pre", metric=None, tokenizer=None,
                   max_batch: int = 64) -> Labelled:
    """Patch snapshot ``name`` (layer-local, with an n axis) of each layer at each position: (L, n).

    ``metric(logits (B, n, V)) -> (B,)``; default: the logit difference, at the
    last position, between the clean run's most likely next token and the
    corrupted run's. ``tokenizer`` labels positions with token pieces.

    >>> from glassllm.nn import Transformer
    >>> sweep = layer_position(Transformer(seed=0), [1, 2, 3], [1, 5, 3], metric=logit_diff(7, 8))
    >>> sweep.dims, sweep.shape
    (('layer', 'position'), (4, 3))
    """
    s = _Sweep(model, clean, corrupt, name, metric, max_batch)
    if "n" not in s.axes:
        raise ValueError(f"{s.names[0]!r} has no position axis n (axes {', '.join(s.axes)})")
    n, axis = len(s.clean), s.axes.index("n")
    values = np.zeros((s.L, n))
    for layer in range(s.L):
        sels = np.zeros((n,) + s.shape(layer), dtype=bool)             # (n, *shape): row p patches position p
        for p in range(n):
            sels[(p,) + (slice(None),) * axis + (p,)] = True
        values[layer] = s.run(layer, sels)
    return s.result(values, ("layer", "position"), [range(s.L), s.positions(tokenizer)], name)


def heads(model, clean, corrupt, *, name: str = "attn.mix", metric=None, max_batch: int = 64) -> Labelled:
    """Patch one head of snapshot ``name`` (all its positions) in each layer: (L, heads).

    Default ``attn.mix``: a head's output before W_O (TransformerLens' ``hook_z``).
    """
    s = _Sweep(model, clean, corrupt, name, metric, max_batch)
    axis = s.head_axis()
    count = s.shape(0)[axis]
    values = np.zeros((s.L, count))
    for layer in range(s.L):
        sels = np.zeros((count,) + s.shape(layer), dtype=bool)         # (heads, *shape)
        for h in range(count):
            sels[(h,) + (slice(None),) * axis + (h,)] = True
        values[layer] = s.run(layer, sels)
    return s.result(values, ("layer", "head"), [range(s.L), range(count)], name)


def head_position(model, clean, corrupt, *, name: str = "attn.mix", metric=None, tokenizer=None,
                  max_batch: int = 64) -> Labelled:
    """Patch one head of snapshot ``name`` at one position in each layer: (L, heads, n)."""
    s = _Sweep(model, clean, corrupt, name, metric, max_batch)
    axis = s.head_axis()
    if "n" not in s.axes:
        raise ValueError(f"{s.names[0]!r} has no position axis n (axes {', '.join(s.axes)})")
    pos_axis, count, n = s.axes.index("n"), s.shape(0)[axis], len(s.clean)
    values = np.zeros((s.L, count, n))
    for layer in range(s.L):
        sels = np.zeros((count * n,) + s.shape(layer), dtype=bool)     # (heads * n, *shape)
        for h in range(count):
            for p in range(n):
                index = [slice(None)] * len(s.axes)
                index[axis], index[pos_axis] = h, p
                sels[(h * n + p,) + tuple(index)] = True
        values[layer] = s.run(layer, sels).reshape(count, n)
    return s.result(values, ("layer", "head", "position"), [range(s.L), range(count), s.positions(tokenizer)], name)


def attribution(model, clean, corrupt, *, metric=None, tokenizer=None, resid: str = "resid_pre",
                head: str = "attn.mix") -> dict:
    """Attribution patching: every cell of the three sweeps at once, to first order in the patched values.

    Patching a cell replaces the corrupted run's values a there by the clean run's a'; to first order
    the metric then moves by ``sum((a' - a) * d metric / d a)`` over the cell's numbers, with the
    gradient taken in the corrupted run. One forward of the clean prompt (its values), one forward
    and one backward of the corrupted prompt (its values and gradients) give that for every cell,
    where the sweeps run one patched forward per cell. Returns a dict of
    :class:`~glassllm.trace.labelled.Labelled` arrays shaped and labelled as the sweep of the same
    name, each holding the corrupted metric plus that first-order change (the sweep's prediction):

    * ``"layer_position"`` (L, n): snapshot ``resid`` of each layer at each position (:func:`layer_position`);
    * ``"heads"`` (L, heads): one head of snapshot ``head``, all positions (:func:`heads`);
    * ``"head_position"`` (L, heads, n): one head at one position (:func:`head_position`).

    ``metric(logits (1, n, V)) -> (1,)`` must be written with indexing and arithmetic that
    glassllm's autograd follows (it gets the logits as a :class:`~glassllm.autograd.Tensor`), as
    :func:`logit_diff`, the default, is. The estimate is exact where the metric is linear in the
    cell; it is a guess where the model is far from linear between the two runs (a patched
    embedding often is), which is why the sweeps exist.

    >>> from glassllm.nn import Transformer
    >>> att = attribution(Transformer(seed=0), [1, 2, 3], [1, 5, 3], metric=logit_diff(7, 8))
    >>> att["layer_position"].shape, att["heads"].shape, att["head_position"].shape
    ((4, 3), (4, 4), (4, 4, 3))
    """
    clean, corrupt = _check_pair(model, clean, corrupt)
    axes = model.snapshot_axes()
    L = model.config.n_layers
    resids = [resolve(resid, axes, layer=i)[0] for i in range(L)]
    mixes = [resolve(head, axes, layer=i)[0] for i in range(L)]
    if "n" not in axes[resids[0]]:
        raise ValueError(f"{resids[0]!r} has no position axis n (axes {', '.join(axes[resids[0]])})")
    if head_axis(axes[mixes[0]]) is None or "n" not in axes[mixes[0]]:
        raise ValueError(f"{mixes[0]!r} needs a head axis and a position axis (axes {', '.join(axes[mixes[0]])}); "
                         "use attn.mix, attn.head_out, attn.q, ...")
    names = list(dict.fromkeys(resids + mixes))
    with ag.no_grad():
        source = trace(model, clean, names=names)
    if not ag.is_grad_enabled():
        raise ValueError("attribution back-propagates the metric: call it outside no_grad()")
    tracer = Tracer(model, names=names)
    with parameter_grads_kept(model), tracer:
        logits = model(corrupt[None])                                           # (1, n, V)
        if metric is None:
            metric = _default_metric(source.logits, logits.data[0])
        value = metric(logits)
        if not isinstance(value, Tensor) or value.data.size != 1:
            got = f"a Tensor of shape {value.shape}" if isinstance(value, Tensor) else type(value).__name__
            raise ValueError(f"attribution differentiates the metric: it must give one number as a glassllm Tensor "
                             f"(write it with indexing and arithmetic on the logits, as logit_diff), got {got}")
        value.sum().backward()
    run = tracer.trace
    baseline = {"clean": float(_metric_of(metric, source.logits[None])[0]), "corrupt": float(value.data.sum())}

    def change(name: str) -> np.ndarray:
        """(a' - a) * d metric / d a, in float64, with the head axis (if any) and n first."""
        d = (source.get(name).astype(np.float64) - run.get(name)) * run.grad(name)
        keep = [i for i in (head_axis(axes[name]), axes[name].index("n")) if i is not None]
        return np.moveaxis(d, keep, range(len(keep))).reshape(*(d.shape[i] for i in keep), -1).sum(-1)

    by_position = np.stack([change(k) for k in resids])                          # (L, n)
    by_cell = np.stack([change(k) for k in mixes])                               # (L, heads, n)
    positions = _positions(clean, tokenizer)
    count = by_cell.shape[1]
    title = f"attribution patching {{}}: {getattr(metric, '__name__', 'metric')}"
    base = baseline["corrupt"]
    return {
        "layer_position": Labelled(base + by_position, ("layer", "position"), [range(L), positions],
                                   title.format(resid), baseline),
        "heads": Labelled(base + by_cell.sum(-1), ("layer", "head"), [range(L), range(count)],
                          title.format(head), baseline),
        "head_position": Labelled(base + by_cell, ("layer", "head", "position"),
                                  [range(L), range(count), positions], title.format(head), baseline),
    }
