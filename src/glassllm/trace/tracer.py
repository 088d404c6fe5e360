"""The :class:`Tracer`: records snapshots (and their gradients) while the model runs.

The model calls three methods on an attached tracer (see :mod:`glassllm.nn`):
``begin_forward(n=, m=, start=, tokens=, pad=)`` at the start of every forward,
``wants(names)`` to decide whether a layer must run its reference code instead of a kernel, and
``record(name, t)``, whose return value flows on downstream -- which is how
interventions replace a snapshot.
"""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np

from .. import autograd as ag
from ..autograd import Tensor
from ..checks import ParameterError
from ..generate import prompt_ids
from .interventions import Intervention
from .record import Step, Trace
from .registry import check_index, registry, resolve_all, storage_dtype

# Snapshots that are views into buffers the model later overwrites (the KV
# cache's arrays, when a cache is rewound or reused): always stored as copies.
# Every other snapshot is a fresh array that no op ever writes into again.
_BUFFER_VIEWS = ("cache_k", "cache_v")


class Tracer:
    """Records snapshots (and their gradients) of ``model`` while the ``with`` block runs.

    ``names``: None records every snapshot; otherwise a name, glob or
    layer-local name, or a list of them (each must match some snapshot); an
    empty list records nothing (to run interventions only).
    ``batch``: which batch row to keep. ``dtype``: storage dtype (float16,
    float32 or float64; default: the model's). ``interventions``: edits applied
    during every forward (see :class:`Intervention`).

    Outside ``no_grad()`` the tracer keeps each recorded tensor's place in the
    autograd graph, so that a backward pass (inside the block, or followed by
    :meth:`collect_grads`) can store its gradient; until then the graph's
    activations stay in memory. To record values only, run under ``no_grad()``
    (as :func:`trace` does without ``targets``).

    >>> from glassllm.nn import Transformer
    >>> model = Transformer(seed=0)
    >>> with Tracer(model, names="logits") as tracer:
    ...     _ = model([1, 2, 3])
    ...     _ = model([4])
    >>> [(s.n, s.m) for s in tracer.trace.steps]
    [(3, 3), (1, 1)]
    """

    def __init__(self, model, names=None, *, batch: int = 0, dtype=None, interventions=()):
        if not (hasattr(model, "config") and hasattr(model, "set_tracer")):
            raise TypeError(f"Tracer needs a glassllm Transformer, got {type(model).__name__}")
        self.model = model
        self.config = model.config
        self.axes = registry(model)
        self.selected = set(self.axes) if names is None else set(resolve_all(names, self.axes))
        self.batch = check_index(batch, "batch")
        self.dtype = storage_dtype(dtype)
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
        self._model_dtype = None                       # the model's dtype at the first forward
        self._edited = None                            # (step, intervention) of this forward's last change

    # -- the protocol the model calls -----------------------------------------
    def begin_forward(self, n: int, m: int, start: int, tokens, pad=None) -> None:
        """A forward of n new tokens against m keys begins: open a new step.

        ``pad`` (B,): each row's left padding, when a batch holds prompts of different lengths.
        """
        tokens = np.asarray(tokens)
        if self.batch >= tokens.shape[0]:
            raise ValueError(f"batch={self.batch} is out of range: the forward has batch size {tokens.shape[0]}")
        dtype = np.dtype(self.model.dtype).name
        if self._model_dtype is None:
            self._model_dtype = dtype
        elif dtype != self._model_dtype:
            raise ValueError(f"the model's dtype changed from {self._model_dtype} to {dtype} while it was traced; "
                             "use one Tracer per dtype")
        row_pad = 0 if pad is None else int(pad[self.batch])
        self.steps.append(Step(len(self.steps), int(n), int(m), int(start), tokens[self.batch].copy(), pad=row_pad))

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
            if not isinstance(new, Tensor) or new.shape != t.shape or new.dtype != t.dtype:
                got = f"{new.dtype} {new.shape}" if isinstance(new, Tensor) else type(new).__name__
                raise ValueError(f"{iv!r} returned {got} for {name!r}, expected a Tensor of "
                                 f"{np.dtype(t.dtype).name} {t.shape}")
            t = new
            self._edited = (step, iv)
        if self._edited is not None and self._edited[0] is step and t.data.dtype.kind == "f":
            with np.errstate(invalid="ignore"):
                broken = np.isnan(t.data).any() or np.isposinf(t.data).any()   # -inf is a mask's, and fine
            if broken:
                raise ValueError(f"after {self._edited[1]!r}, snapshot {name!r} is non-finite (NaN or +inf): the changed "
                                 f"numbers overflow what the model computes in {np.dtype(t.dtype).name}; "
                                 "give smaller values")
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

        Called on exit. If no backward has run yet, nothing is stored (call
        this again after a backward that runs outside the with-block). A
        snapshot the loss does not depend on (``probs`` when the loss is
        computed from the logits) gets a zero gradient.
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
        model_dtype = self._model_dtype or np.dtype(self.model.dtype).name
        dtype = model_dtype if self.dtype is None else np.dtype(self.dtype).name
        # A list of its own: later forwards of this tracer do not change a Trace already handed out.
        return Trace(self.config, self.axes, [k for k in self.axes if k in self.selected], list(self.steps),
                     self.batch, dtype, [repr(iv) for iv in self.interventions])

    def names(self) -> list[str]:
        """The names this tracer records, in forward order."""
        return [k for k in self.axes if k in self.selected]


@contextmanager
def parameter_grads_kept(model):
    """A backward pass inside leaves the parameters' ``.grad`` as they were before it (for a trace's gradients)."""
    params = model.parameters()
    saved = [p.grad for p in params]
    for p in params:
        p.grad = None
    try:
        yield
    finally:
        for p, g in zip(params, saved):
            p.grad = g


IGNORE_INDEX = -100    # a target equal to this adds nothing to the loss (glassllm.autograd.cross_entropy)


def trace(model, tokens, names=None, *, targets=None, loss_at=None, cache=None, batch: int = 0, dtype=None,
          interventions=(), tokenizer=None) -> Trace:
    """Run one forward of ``tokens`` (B, n) or (n,) under a :class:`Tracer` and return its :class:`Trace`.

    ``tokens`` may be text, with ``tokenizer=``: it is encoded as :func:`glassllm.generate.generate`
    reads a prompt (``tokenizer.encode_prompt``: special tokens allowed, ``<s>`` first for a
    SentencePiece Llama). The returned trace holds the forward's ``logits`` (n, V) of the kept
    batch row whatever ``names`` records, and the ``tokenizer`` (which then labels ``show()``),
    like TransformerLens' ``run_with_cache(text)``, which returns the logits with the cache.

    With ``targets``, the mean cross-entropy is back-propagated too, so every
    snapshot gets its gradient (``trace.loss`` holds the loss). The
    parameters' ``.grad`` are left as they were.

    ``targets``: next-token ids, the tokens' shape. ``loss_at``: the
    position(s) whose loss counts (an int or a list; negative counts from the
    end; default: every position). With ``loss_at``, ``targets`` may also
    give only those positions' ids: (k,) for k positions, or (B, k).
    Either way, a target equal to ``IGNORE_INDEX`` (-100) adds nothing to
    the loss, as in PyTorch.

    >>> from glassllm.nn import Transformer
    >>> t = trace(Transformer(seed=0), [5, 6, 7], targets=[9], loss_at=-1)   # the loss of the last position only
    >>> bool(t.grad("logits")[:2].any()), bool(t.grad("logits")[2].any())   # only the last position's logits
    (False, True)
    """
    tracer = Tracer(model, names, batch=batch, dtype=dtype, interventions=interventions)
    if tokenizer is not None and getattr(tokenizer, "vocab_size", None) != model.config.vocab_size:
        raise ParameterError("tokenizer", f"has {getattr(tokenizer, 'vocab_size', None)} ids but the model "
                                          f"expects {model.config.vocab_size}")
    if isinstance(tokens, str):
        tokens = np.array(prompt_ids(tokens, model, tokenizer, "tokens"))         # (n,)
    if loss_at is not None and targets is None:
        raise ValueError("loss_at= chooses where the loss of targets= counts: pass targets= too")
    if targets is not None:
        shape = np.shape(model.check_tokens(tokens))
        targets = _targets(targets, shape, loss_at)
        if not ag.is_grad_enabled():
            raise ValueError("trace(..., targets=) back-propagates the loss: call it outside no_grad()")
    if targets is None:
        with ag.no_grad(), tracer:
            logits = model(tokens, cache)
        out = tracer.trace
        out.without_loss = True
        return _finish(out, logits, batch, tokenizer)
    with parameter_grads_kept(model), tracer:
        logits = model(tokens, cache)
        loss = ag.cross_entropy(logits, targets, IGNORE_INDEX)
        loss.backward()
    out = tracer.trace
    out.loss = float(loss.item())
    return _finish(out, logits, batch, tokenizer)


def _finish(out: Trace, logits: Tensor, batch: int, tokenizer) -> Trace:
    """The trace with the kept row's logits (read-only) and the tokenizer that read its text."""
    row = np.array(logits.data[batch])                                          # (n, V)
    row.flags.writeable = False
    out.logits, out.tokenizer = row, tokenizer
    return out


def _targets(targets, shape: tuple, loss_at) -> np.ndarray:
    """Targets (B, n) for tokens of ``shape`` (B, n): every position not in ``loss_at`` set to IGNORE_INDEX."""
    B, n = shape
    targets = np.asarray(targets)
    given = targets.shape
    if targets.dtype.kind not in "iu":
        raise TypeError(f"targets must be integer token ids, got {targets.dtype}")
    if targets.ndim == 1 and B == 1:
        targets = targets[None]
    if loss_at is None:
        if targets.shape != shape:
            raise ValueError(f"targets of shape {given} do not match the tokens' shape {shape}")
        return targets
    at = np.atleast_1d(np.asarray(loss_at))
    if at.size == 0 or at.ndim != 1 or at.dtype.kind not in "iu" or isinstance(loss_at, bool):
        raise TypeError(f"loss_at must be a position or a non-empty list of positions, got {loss_at!r}")
    if np.any((at < -n) | (at >= n)):
        raise ValueError(f"loss_at {at.tolist()} out of range: the tokens have positions 0..{n - 1} "
                         f"(or -{n}..-1 from the end)")
    at = at % n
    if len(set(at.tolist())) != len(at):
        raise ValueError(f"loss_at lists a position twice: {np.asarray(loss_at).tolist()}")
    full = np.full(shape, IGNORE_INDEX, dtype=np.int64)
    if targets.shape == shape:
        full[:, at] = targets[:, at]
    elif targets.shape == (B, len(at)):
        full[:, at] = targets
    else:
        raise ValueError(f"targets of shape {given} match neither the tokens' shape {shape} "
                         f"nor the {len(at)} position(s) of loss_at")
    return full
