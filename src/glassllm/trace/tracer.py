"""The :class:`Tracer`: records snapshots (and their gradients) while the model runs.

The model calls three methods on an attached tracer (see :mod:`glassllm.nn`):
``begin_forward(n=, m=, start=, tokens=, pad=, paths=)`` at the start of every forward
(``paths``: which layers run a kernel and which their reference),
``wants(names)`` to decide whether a layer must run its reference code instead of a kernel, and
``record(name, t)``, whose return value flows on downstream -- which is how
interventions replace a snapshot.
"""

from __future__ import annotations

import contextlib
import copy
import math
import threading
from collections import OrderedDict
from contextlib import contextmanager

import numpy as np

from .. import autograd as ag
from .. import kernels
from ..autograd import Tensor
from ..checks import ParameterError, check_int
from ..generate import prompt_ids
from ..positions import check_fits
from .interventions import Intervention
from .record import Step, Trace
from .registry import axis_sizes, check_index, registry, resolve_all, storage_dtype

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
    def begin_forward(self, n: int, m: int, start: int, tokens, pad=None, paths=None) -> None:
        """A forward of n new tokens against m keys begins: open a new step.

        ``pad`` (B,): each row's left padding, when a batch holds prompts of different lengths.
        ``paths``: {layer name: the kernel it runs, or "reference"}, kept as the step's ``paths``.
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
        self.steps.append(Step(len(self.steps), int(n), int(m), int(start), tokens[self.batch].copy(), pad=row_pad,
                               paths=dict(paths or {})))

    def wants(self, names) -> bool:
        """Does any of these full names need to be seen (recorded or edited)? A layer that runs a kernel
        asks this: if so, it runs its reference code instead."""
        active = self._active
        return any(k in active for k in names)

    def observes(self, name: str) -> bool:
        """Is this full name recorded or edited? A snapshot that nothing downstream reads (``probs``) is
        computed only then, even where :meth:`wants` makes every layer run its reference code."""
        return name in self._active

    leaf_at_embedding = False       # trace(targets=): the weights need no gradient, the embedding is a leaf

    def record(self, name: str, t: Tensor) -> Tensor:
        """Apply the interventions on ``name``, store it if selected; return what flows on."""
        if self.leaf_at_embedding and name == "embed" and ag.is_grad_enabled() and not t.requires_grad:
            t = Tensor(t.data, requires_grad=True)              # d loss / d embed, without the weights'
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
                raise ValueError(f"after {self._edited[1]!r}, snapshot {name!r} is non-finite (NaN or +inf): with the "
                                 f"changed numbers the model's {np.dtype(t.dtype).name} arithmetic overflows or "
                                 "divides by zero; give smaller values, and no 0 where the model divides (a norm's rms)")
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
        if self.model.tracer is not None:
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


@contextmanager
def weights_frozen(model):
    """Inside, the model's parameters need no gradient: a backward pass computes the gradients of the
    activations only (a trace keeps no weight gradient, so it skips their GEMMs). The graph is recorded
    where some input needs a gradient (a lazy trace's block input)."""
    params = model.parameters()
    for p in params:
        p.requires_grad = False
    try:
        yield
    finally:
        for p in params:
            p.requires_grad = True


IGNORE_INDEX = -100    # a target equal to this adds nothing to the loss (glassllm.autograd.cross_entropy)


def trace(model, tokens, names=None, *, targets=None, loss_at=None, cache=None, batch: int = 0, dtype=None,
          interventions=(), tokenizer=None, lazy: bool = False) -> Trace:
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

    ``lazy=True`` returns a :class:`~glassllm.trace.lazy.LazyTrace`: it keeps the residual stream
    between blocks (and the gradient arriving at each block) and computes a block's snapshots when
    one of them is read -- for large models and long prompts, where every snapshot of every block
    would not fit in memory. One row of tokens, no ``cache``, ``names`` None (every name is readable).

    >>> from glassllm.nn import Transformer
    >>> t = trace(Transformer(seed=0), [5, 6, 7], targets=[9], loss_at=-1)   # the loss of the last position only
    >>> bool(t.grad("logits")[:2].any()), bool(t.grad("logits")[2].any())   # only the last position's logits
    (False, True)
    """
    if tokenizer is not None and getattr(tokenizer, "vocab_size", None) != model.config.vocab_size:
        raise ParameterError("tokenizer", f"has {getattr(tokenizer, 'vocab_size', None)} ids but the model "
                                          f"expects {model.config.vocab_size}")
    if isinstance(tokens, str):
        tokens = np.array(prompt_ids(tokens, model, tokenizer, "tokens"))         # (n,)
    if lazy:
        if names is not None or cache is not None or batch != 0:
            raise ValueError("trace(..., lazy=True) records every name of one row without a cache: "
                             "leave names, cache and batch at their defaults")
        if loss_at is not None and targets is None:
            raise ValueError("loss_at= chooses where the loss of targets= counts: pass targets= too")
        if isinstance(interventions, Intervention):
            interventions = [interventions]
        full = None
        if targets is not None:
            full = _targets(targets, np.shape(model.check_tokens(tokens)), loss_at)
            if not ag.is_grad_enabled():
                raise ValueError("trace(..., targets=) back-propagates the loss: call it outside no_grad()")
        out = LazyTrace(model, tokens, full, interventions, dtype)
        out.tokenizer = tokenizer
        return out
    tracer = Tracer(model, names, batch=batch, dtype=dtype, interventions=interventions)
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
    tracer.leaf_at_embedding = True                          # the weights frozen: the graph starts there
    with parameter_grads_kept(model), weights_frozen(model), tracer:
        logits = model(tokens, cache)
        loss = ag.cross_entropy(logits, targets, IGNORE_INDEX)
        loss.backward()
    out = tracer.trace
    out.loss = float(loss.item())
    return _finish(out, logits, batch, tokenizer)


def _finish(out: Trace, logits: Tensor, batch: int, tokenizer) -> Trace:
    """The trace with the kept row's logits (read-only) and the tokenizer that read its text.

    One row: a view of the forward's own output, which nothing writes again (no second (n, V) array,
    50 MB at a vocabulary of 49,152 and 256 tokens); a batch: a copy of the kept row, so that the
    trace does not hold the other rows."""
    data = logits.data
    row = data[batch].view() if data.shape[0] == 1 else np.array(data[batch])  # (n, V)
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


# ----------------------------------------------------------------------------
# Lazy traces: a block's snapshots computed when read
# ----------------------------------------------------------------------------


class _Reference(Tracer):
    """A tracer under which every layer runs its reference code (as under a tracer that records
    everything), whatever it records: a lazy trace's passes compute what a full trace computes.

    ``entering`` keeps, for each block input (``layers.{i}.resid_pre``) that an intervention changes,
    the tensor that arrived before the change: the block runs again from it, so that the change is made
    once, and its gradient is what flows on to the block before (zero where an edit cut the graph)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.entering: dict[str, Tensor] = {}

    def wants(self, names) -> bool:
        return True

    def record(self, name, t):
        if name in self._edits and name.endswith(".resid_pre"):
            if ag.is_grad_enabled() and t.requires_grad:
                t = ag.reshape(t, t.shape).retain_grad()                  # d loss / d the block's input
            self.entering[name] = t
        return super().record(name, t)


class _Enough(Exception):
    """Raised by :class:`_UpTo` once a block has recorded every name it was asked for."""


class _UpTo(_Reference):
    """A :class:`_Reference` that ends a block's run (raising :class:`_Enough`) as soon as it has recorded
    every name of ``pending``, so that nothing after those names is computed."""

    pending: set | None = None      # the names the current block has still to record

    def record(self, name, t):
        t = super().record(name, t)
        if self.pending is not None:
            self.pending.discard(name)
            if not self.pending:
                raise _Enough
        return t


class _SameGraph(_Reference):
    """A :class:`_Reference` whose graph is a full trace's: every snapshot it does not record still gets the
    identity node a recorded one gets, so a backward sums each gradient in the full trace's order."""

    also: frozenset = frozenset()   # names whose values are stored too, without a gradient

    def record(self, name, t):
        if name in self.selected or name not in self.axes:
            return super().record(name, t)
        t = super().record(name, t)                                       # its interventions first
        if name in self.also:
            self.steps[-1].values[name] = self._keep(name, t.data)
        return ag.reshape(t, t.shape) if ag.is_grad_enabled() and t.requires_grad else t


class LazyTrace(Trace):
    """The :class:`~glassllm.trace.Trace` of one forward of one row of tokens, computed a block at a time
    when read. Made by ``trace(model, tokens, lazy=True)``.

    A full trace of a large model holds every snapshot of every block, with its gradient: for a
    135M-parameter Llama and 256 tokens, gigabytes. :class:`LazyTrace` keeps only what is cheap to keep
    for the prompt -- the residual stream at each block's input (``layers.{i}.resid_pre``), the last
    block's output, the embedding and, after one backward pass, the gradient arriving at each block's
    output -- and computes the rest when it is read:

    - a name inside block i (``layers.{i}.*``): block i runs again from its stored input, under a
      :class:`~glassllm.trace.Tracer` that records the block's snapshots (and applies the trace's
      interventions); with a loss, its output is back-propagated from the stored gradient, which gives
      every snapshot of the block its gradient;
    - ``norm.*``, ``logits``, ``probs``: the final norm and head run again from the last block's output,
      and the loss is back-propagated from there.

    Computed blocks are kept, least recently read first out, within ``keep_bytes``. Every pass runs the
    model's reference code, as a full :func:`~glassllm.trace.trace` does (no fused kernel), and records a
    block's snapshots on the same graph, so values and gradients are the full trace's bit for bit. With
    ``targets`` (or ``graph=True`` and a later :meth:`backward`), the forward's graph is kept until the
    backward, which then runs once over the whole model (the weights need no gradient: a trace keeps
    none), and every block's attention weights, and then their gradients, are kept for :meth:`across` if
    the weights fit in ``grid_bytes`` (:meth:`grid_kept`);
    a backward without that graph runs a block at a time (as gradient checkpointing does), each block's
    forward again, passing the stored gradient on.

    >>> from glassllm.nn import Transformer
    >>> from glassllm.trace import trace
    >>> model = Transformer(seed=0)
    >>> lazy = trace(model, [5, 6, 7], targets=[6, 7, 8], lazy=True)
    >>> lazy.get("layers.1.attn.softmax").shape, lazy.grad("layers.1.mlp.act").shape
    ((4, 3, 3), (3, 352))

    ``targets`` (n,): next-token ids, ``IGNORE_INDEX`` where the loss does not count (None: values
    only). ``keep_bytes``: how many bytes of computed blocks to keep (default 256 MB). ``grid_bytes``: how
    many bytes of every block's attention weights the one-graph pass may keep for :meth:`across`, their
    gradients as many again (default ``keep_bytes``). ``graph``: keep
    the forward's graph for one :meth:`backward` (memory: every block's intermediates until then).
    ``nbytes`` is what the trace holds now; ``reserved_bytes`` what it may grow to.

    As a mapping it holds every name, whether computed yet or not: ``lazy["attn.softmax", 2]`` computes
    block 2 as :meth:`get` does, and ``len``, ``in`` and iteration see every snapshot of the model.
    """

    def __init__(self, model, tokens, targets=None, interventions=(), dtype=None, keep_bytes: int = 256 << 20,
                 graph: bool = False, grid_bytes: int | None = None):
        tokens = model.check_tokens(tokens)
        if tokens.shape[0] != 1:
            raise ValueError(f"a lazy trace follows one row of tokens, got a batch of {tokens.shape[0]}")
        check_fits(0, tokens.shape[1], model.config.max_seq_len)          # as the model refuses it
        keep_bytes = check_int("keep_bytes", keep_bytes, low=0)
        self._grid = keep_bytes if grid_bytes is None else check_int("grid_bytes", grid_bytes, low=0)
        shared = {id(p.data): p.data for p in model.parameters()}
        self._model = copy.deepcopy(model, shared)          # its own modules (and tracer slot), the same weights
        self._interventions = list(interventions)
        self._dtype = dtype
        self._keep = keep_bytes
        self._lock = threading.RLock()
        self._segments: OrderedDict[str, list[str]] = OrderedDict()  # computed segment -> the names it added
        self._held = 0
        self._all_blocks: int | None = None                 # bytes of every block's snapshots and gradients
        L = model.config.n_layers
        self._n = n = tokens.shape[1]
        self._tokens = tokens

        # One forward, keeping the residual stream between blocks (and the logits, for the loss).
        base = ["embed"] + [f"layers.{i}.resid_pre" for i in range(L)] + [f"layers.{L - 1}.resid_post", "logits"]
        self._graph = None
        self._across: dict[str, np.ndarray] = {}          # every block's attention weights, if kept
        self._across_grads: dict[str, np.ndarray] = {}    # and their gradients, after the one-graph backward
        if (graph or targets is not None) and ag.is_grad_enabled():
            probe = self._forward_kept(base)
        else:
            probe = _Reference(self._model, base, dtype=dtype, interventions=self._interventions)
            with ag.no_grad(), probe:
                self._model(tokens)
        step = probe.trace.steps[0]
        # What each block receives: its resid_pre before that name's interventions, which a block run
        # again applies itself (the same array where none applies).
        self._inputs = [probe._keep(k, probe.entering[k].data) if k in probe.entering else step.values[k]
                        for k in (f"layers.{i}.resid_pre" for i in range(L))]       # (n, C) each
        self._final = step.values[f"layers.{L - 1}.resid_post"]                         # (n, C)
        self.last_logits = np.array(step.values["logits"][-1])                          # (V,)
        logits = step.values["logits"]                                                  # (n, V), as trace() keeps
        kept = {"embed": step.values["embed"]}
        super().__init__(model.config, probe.axes, list(probe.axes), [
            Step(0, n, n, 0, tokens[0].copy(), values=kept, paths=dict(step.paths))], 0, probe.trace.dtype,
            [repr(iv) for iv in self._interventions])
        self._always = dict(kept)
        # The residual stream between the blocks, as kept: read without computing a block.
        self._streams = {f"layers.{i}.resid_pre": step.values[f"layers.{i}.resid_pre"] for i in range(L)}
        self._streams[f"layers.{L - 1}.resid_post"] = self._final
        self.logits = logits
        self._out_grads: list[np.ndarray | None] = [None] * L
        self._targets = None
        self.without_loss = True
        if targets is not None:
            self.backward(targets)

    def backward(self, targets) -> "LazyTrace":
        """Back-propagate the mean cross-entropy of next-token ``targets`` (n,; ``IGNORE_INDEX`` where the
        loss does not count) a block at a time, so that every snapshot has its gradient; returns self.
        Once per trace (``LazyTrace(..., targets)`` calls it): the target may come from this trace's own
        ``last_logits``, without a second forward."""
        if self._targets is not None:
            raise ValueError("this lazy trace has its loss already (one backward per trace)")
        targets = np.asarray(targets)
        if targets.dtype.kind not in "iu" or targets.size != self._n:
            raise ValueError(f"targets must be {self._n} token ids, got {targets.dtype} of shape {targets.shape}")
        with self._lock:
            for names in self._segments.values():        # blocks read before: values only, computed again
                for k in names:
                    self.steps[0].values.pop(k, None)
            self._segments.clear()
            self._held = 0
            self._targets = targets.reshape(1, self._n)
            self.without_loss = False
            if self._graph is not None:
                self._backward_kept()
                return self
            # Each segment records its own snapshots on the way, as a full trace does: the same graph,
            # so the same sums in the same order, and the last blocks computed are kept.
            g = self._segment("outer")
            for i in reversed(range(len(self._inputs))):
                self._out_grads[i] = g
                g = self._segment(f"layers.{i}")
            self.steps[0].grads["embed"] = g                 # the embedding is block 0's input
            self._always["embed.grad"] = g
        return self

    def across(self, *locals_: str, grads: bool = False) -> dict[str, np.ndarray]:
        """``layers.{i}.{local}`` of every block for each layer-local name, nothing kept; ``grads``: their
        gradients instead of their values.

        Values: each block runs again from its kept input, under its reference code and the trace's
        interventions, only until it has recorded those names: the head grid's softmax of every layer
        costs every layer's norm and attention up to its softmax, not the model's whole forward.
        Gradients: each block's forward and backward (:meth:`grad`). Either is read at no cost where the
        one-graph forward and backward kept it (every block's attention weights, and their gradients,
        when they fit in ``grid_bytes``)."""
        names = [f"layers.{i}.{local}" for local in locals_ for i in range(len(self._inputs))]
        unknown = [k for k in names if k not in self.axes]
        if unknown:
            raise ValueError(f"{unknown[0]!r} is not a snapshot of this model")
        kept = self._across_grads if grads else self._across
        if all(k in kept for k in names):
            return {k: kept[k] for k in names}             # kept from the forward (and its backward)
        if grads:
            return {k: self.grad(k) for k in names}
        model, n = self._model, self._n
        rope = model.rotary.tables(np.arange(0, n))                        # (n, D/2) each
        probe = _UpTo(model, names, dtype=self._dtype, interventions=self._interventions)
        with self._lock, weights_frozen(model), ag.no_grad(), probe:
            probe.begin_forward(n=n, m=n, start=0, tokens=self._tokens)
            with kernels.chosen(model.kernel_slots, n=n, m=n, cache=None):
                for i, block in enumerate(model.layers):
                    probe.pending = {f"layers.{i}.{local}" for local in locals_}
                    try:
                        block(Tensor(np.asarray(self._inputs[i], dtype=model.dtype)[None]), rope, None, 0, None)
                    except _Enough:                        # the block's names are recorded: the rest is not needed
                        pass
        return dict(probe.trace.steps[0].values)

    # -- one forward and one backward on one graph -----------------------------------
    def _forward_kept(self, base: list[str]) -> Tracer:
        """The forward on one graph from a leaf at the embedding, the weights frozen, recording ``base``;
        the graph waits for :meth:`backward`. Each block runs as :meth:`_block` runs it, and every snapshot
        has the identity node a full trace gives it, so the gradients between the blocks are a full
        trace's, bit for bit."""
        model, n, tokens = self._model, self._n, self._tokens
        # Every block's attention weights and mask, for across() (the head grid), if they fit in grid_bytes;
        # and then the weights' gradients too (recorded, so that the backward keeps them).
        kept = self.grid_kept(model.config, n, self._grid)
        softmax = [f"layers.{i}.attn.softmax" for i in range(model.config.n_layers)]
        probe = _SameGraph(model, base + softmax if kept else base, dtype=self._dtype,
                           interventions=self._interventions)
        if kept:
            probe.also = frozenset(softmax + [f"layers.{i}.attn.mask" for i in range(model.config.n_layers)])
        cos, sin = model.rotary.tables(np.arange(0, n))                    # (n, D/2)
        with weights_frozen(model), probe, kernels.chosen(model.kernel_slots, n=n, m=n, cache=None) as plan:
            model.begin_forward(plan, n=n, m=n, start=0, tokens=tokens)
            with ag.no_grad():
                x = model.snap("embed", model.tok_embeddings.run(tokens))  # (1, n, C)
            x = Tensor(x.data, requires_grad=True)                          # the leaf: d loss / d embed
            h = x
            for block in model.layers:
                h = block.run(h, (cos, sin), None, 0, None)                 # (1, n, C)
            logits = model.snap("logits", model.output.run(model.norm.run(h)))  # (1, n, V)
        self._graph = (probe, x, logits)
        self._across = {k: probe.trace.steps[0].values.pop(k) for k in probe.also}
        return probe

    @staticmethod
    def grid_kept(config, n: int, grid_bytes: int) -> bool:
        """Does the one-graph forward keep every block's attention weights and mask for an ``n``-token prompt
        (and its backward their gradients): when the weights and masks, as float32, fit in ``grid_bytes``."""
        return config.n_layers * (config.n_heads * 4 + 1) * n * n <= grid_bytes

    def _backward_kept(self) -> None:
        """The loss back-propagated through the graph of :meth:`_forward_kept`: the gradient at each
        block's output and at the embedding."""
        probe, leaf, logits = self._graph
        self._graph = None
        L = len(self._inputs)
        with weights_frozen(self._model):
            loss = ag.cross_entropy(logits, self._targets, IGNORE_INDEX)
            loss.backward()
        self.loss = float(loss.item())
        probe.collect_grads()
        grads = probe.trace.steps[0].grads
        # The gradient head grid's: the kept attention weights' gradients (the masks have none).
        self._across_grads = {k: grads.pop(k) for k in self._across if k.endswith(".attn.softmax")}
        for i in range(L - 1):
            k = f"layers.{i + 1}.resid_pre"
            entering = probe.entering.get(k)                                  # an intervention changes it
            if entering is None:
                self._out_grads[i] = grads[k]                                 # (n, C)
            else:
                g = entering.grad
                self._out_grads[i] = self._stored(np.zeros_like(entering.data) if g is None else g)
        self._out_grads[L - 1] = grads[f"layers.{L - 1}.resid_post"]
        g = self._stored(leaf.grad if leaf.grad is not None else np.zeros_like(leaf.data))  # (n, C)
        self.steps[0].grads["embed"] = g
        self._always["embed.grad"] = g

    # -- bytes -----------------------------------------------------------------
    @property
    def nbytes(self) -> int:
        fixed = sum(a.nbytes for a in self._inputs) + self._final.nbytes + self.last_logits.nbytes + self.logits.nbytes
        fixed += sum(g.nbytes for g in self._out_grads if g is not None)
        fixed += sum(a.nbytes for a in self._always.values()) + sum(a.nbytes for a in self._across.values())
        fixed += sum(a.nbytes for a in self._across_grads.values())
        return fixed + self._held

    @staticmethod
    def bytes_for(config, n: int, *, itemsize: int = 4, keep_bytes: int = 256 << 20, loss: bool = True,
                  graph: bool = True, grid_bytes: int | None = None) -> int:
        """What the :attr:`reserved_bytes` of a lazy trace of an ``n``-token prompt come to, before it runs:
        the residual stream between the blocks, the logits, with a loss (``loss``) the gradient at each
        block's output and the embedding's, with ``graph`` every block's attention weights (and with a loss
        their gradients) when they fit in ``grid_bytes`` (default ``keep_bytes``), and the kept blocks at
        their bound (or all of them, when that is less).
        ``itemsize``: bytes per number of the model's dtype (4 for float32)."""
        L, C, V, H = config.n_layers, config.dim, config.vocab_size, config.n_heads
        stream = n * C * itemsize                                            # one (n, C) array
        fixed = (L + 1) * stream + (n + 1) * V * itemsize + stream           # inputs, final, logits, embed
        if loss:
            fixed += L * stream + stream                                     # the gradients between the blocks
        grid = keep_bytes if grid_bytes is None else grid_bytes
        if graph and LazyTrace.grid_kept(config, n, grid):                   # as _forward_kept decides
            fixed += L * (H * itemsize + 1) * n * n                          # softmax (H, n, n) and mask (n, n)
            if loss:
                fixed += L * H * itemsize * n * n                            # and the softmax's gradients
        return fixed + min(keep_bytes, LazyTrace._blocks_bytes(config, registry(config), n, itemsize))

    @staticmethod
    def _blocks_bytes(config, axes: dict, n: int, itemsize: int) -> int:
        """Bytes of every block's snapshots and their gradients (the final norm and head's too: every name
        but the embedding, which is always kept) for an ``n``-token prompt."""
        sizes = axis_sizes(config, n, n)
        values = sum(math.prod(sizes[a] for a in ax) for k, ax in axes.items() if k != "embed")
        return 2 * values * itemsize                                         # values and their gradients

    @property
    def reserved_bytes(self) -> int:
        """What the trace may grow to: what it holds outside the kept blocks, plus the kept blocks at their
        bound -- or at the size of every block's snapshots and gradients together, when that is smaller."""
        if self._all_blocks is None:
            self._all_blocks = self._blocks_bytes(self.config, self.axes, self._n, np.dtype(self.dtype).itemsize)
        return self.nbytes - self._held + min(self._keep, self._all_blocks)

    # -- reading -----------------------------------------------------------------
    # The mapping holds every name: reading one computes its block, as get() does.
    def __getitem__(self, key) -> np.ndarray:
        return self.get(self._key(key))

    def __iter__(self):
        return iter(self._names)

    def __len__(self) -> int:
        return len(self._names)

    def __contains__(self, key) -> bool:
        try:
            return self._key(key) in self.axes
        except KeyError:
            return False

    def _read(self, name, layer, head, step, grads: bool) -> np.ndarray:
        full = self.name(name, layer)
        self.step(step)                                      # one step: refuses another index
        if not grads and full in self._streams:
            return self._streams[full]                       # (n, C), read-only
        with self._lock:
            self._ensure(full)
            return super()._read(full, None, head, step, grads)

    def _segment_of(self, full: str) -> str | None:
        if full == "embed" or full not in self.axes:
            return None
        if full.startswith("layers."):
            return ".".join(full.split(".", 2)[:2])          # "layers.3"
        return "outer"

    def _ensure(self, full: str) -> None:
        seg = self._segment_of(full)
        if seg is None:
            return
        if seg in self._segments:
            self._segments.move_to_end(seg)
            return
        self._segment(seg)

    def _segment(self, seg: str):
        """Run segment ``seg`` ("outer" or "layers.{i}") recording its snapshots (with a loss, their
        gradients too) into the kept blocks; returns d loss / d the segment's input (None without a loss)."""
        names = [k for k in self.axes if self._segment_of(k) == seg]
        tracer = Tracer(self._model, names, dtype=self._dtype, interventions=self._interventions)
        if seg == "outer":
            g = self._outer(tracer)
        else:
            i = int(seg.split(".")[1])
            g = self._block(i, tracer, self._out_grads[i])
        got = tracer.trace.steps[0]
        self.steps[0].values.update(got.values)
        self.steps[0].grads.update(got.grads)
        self._segments[seg] = sorted(set(got.values) | set(got.grads))
        self._segments.move_to_end(seg)
        self._held += sum(a.nbytes for a in got.values.values()) + sum(a.nbytes for a in got.grads.values())
        while self._held > self._keep and len(self._segments) > 1:   # the one just computed stays
            _, dropped = self._segments.popitem(last=False)
            for k in dropped:                                # a segment's own names (never "embed")
                for store in (self.steps[0].values, self.steps[0].grads):
                    a = store.pop(k, None)
                    if a is not None:
                        self._held -= a.nbytes
        return g

    # -- running a segment ---------------------------------------------------------
    def _stored(self, g: np.ndarray) -> np.ndarray:
        g = np.array(g[0])
        g.flags.writeable = False
        return g

    def _run(self, tracer, fn, x: np.ndarray, grad_out):
        """``fn(Tensor x)`` under ``tracer``; with ``grad_out`` back-propagate it (a scalar loss when
        ``grad_out`` is "loss") and return d/dx."""
        want_grad = grad_out is not None
        model = self._model
        with weights_frozen(model), (contextlib.nullcontext() if want_grad else ag.no_grad()), tracer:
            tracer.begin_forward(n=self._n, m=self._n, start=0, tokens=self._tokens)
            leaf = Tensor(np.asarray(x, dtype=model.dtype)[None], requires_grad=want_grad)
            out = fn(leaf)
            if want_grad:
                out.backward() if isinstance(grad_out, str) else out.backward(
                    np.asarray(grad_out, dtype=model.dtype)[None])
        if not want_grad:
            return None
        # An edit that replaces a snapshot by a new tensor cuts the input off: it then gets 0, as in a full trace.
        return leaf.grad if leaf.grad is not None else np.zeros_like(leaf.data)

    def _block(self, i: int, tracer, grad_out):
        """Block i from its stored input; with ``grad_out`` (n, C) its backward: d loss / d input (1, n, C)."""
        model, n = self._model, self._n
        cos, sin = model.rotary.tables(np.arange(0, n))

        def fn(x):
            with kernels.chosen(model.kernel_slots, n=n, m=n, cache=None):
                return model.layers[i](x, (cos, sin), None, 0, None)
        g = self._run(tracer, fn, self._inputs[i], grad_out)
        return None if g is None else self._stored(g)


    def _outer(self, tracer):
        """The final norm and head from the last block's output; with a loss, d loss / d that output."""
        model = self._model
        targets = self._targets

        def fn(x):
            with kernels.chosen(model.kernel_slots, n=self._n, m=self._n, cache=None):
                logits = model.snap("logits", model.output(model.norm(x)))
            model.snap_derived("probs", ag.softmax, logits, axis=-1)
            if targets is None:
                return logits
            loss = ag.cross_entropy(logits, targets, IGNORE_INDEX)
            self.loss = float(loss.item())
            return loss
        g = self._run(tracer, fn, self._final, None if targets is None else "loss")
        return None if g is None else self._stored(g)
