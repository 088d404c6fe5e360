"""What a tracer recorded: :class:`Step` (one forward) and :class:`Trace` (the steps, read by name).

Arrays are stored with the batch axis removed and are read-only.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np

from ..checks import is_int
from .. import viewers
from ..config import ModelConfig
from .files import manifest_of, read_trace_file, save_trace
from .names import to_transformer_lens, transformer_lens_name
from .registry import axis_sizes, check_index, head_axis, registry, resolve


@dataclass
class Step:
    """One forward pass: n new queries at positions start .. start+n-1, against m keys.

    ``tokens`` (n,) are the kept batch row's input ids; ``values`` and
    ``grads`` map snapshot names to arrays (batch removed, read-only).
    ``pad``: in a batch of prompts of different lengths, the kept row's
    positions 0 .. pad-1 are left padding -- filler ids (0) that no query may
    read (``attn.mask`` forbids them) and whose own rows of every snapshot
    carry no meaning (a padded query reads nothing: its ``attn.softmax`` row
    is all zeros). ``n``, ``start`` and ``m`` count the padding; the row's
    own text starts at position ``pad``. 0 when nothing is padded.
    ``paths``: which path each layer that a kernel may replace took in this
    forward, {layer name: kernel name or ``"reference"}``} (a layer whose
    snapshots were recorded ran its reference); empty for a trace read from a file.
    """

    index: int
    n: int
    m: int
    start: int
    tokens: np.ndarray
    values: dict = field(default_factory=dict)
    grads: dict = field(default_factory=dict)
    pad: int = 0
    paths: dict = field(default_factory=dict)


class Trace(Mapping):
    """Snapshots (and gradients) of one or more forward passes, keyed by step and name.

    Read with :meth:`get` / :meth:`grad`; export with :meth:`save`.

    A trace is also a read-only mapping from snapshot name to array, for its first
    forward pass, as TransformerLens' ``ActivationCache`` is: ``trace["layers.0.attn.softmax"]``,
    ``trace["attn.softmax", 0]`` (a layer-local name and a layer; negative layers count from the
    end), ``name in trace``, ``len(trace)``, ``trace.keys()``, ``trace.items()``, iteration, in
    forward order. A TransformerLens hook name works as a key too (``trace["blocks.0.attn.hook_pattern"]``,
    ``trace["pattern", 0]``); the array keeps glassllm's layout (heads first, batch removed):
    :meth:`as_transformer_lens` gives TransformerLens' layout. Later steps (a cached generation's)
    are read with ``get(name, step=)``. Unlike a dict's, :meth:`get` raises for a name that was
    not recorded (it takes ``layer``, ``head`` and ``step``, not a default). Two traces are equal
    only when they are the same object.
    """

    __eq__ = object.__eq__           # not Mapping's element-wise comparison of arrays
    __hash__ = object.__hash__

    def __init__(self, config: ModelConfig, axes: dict, recorded: list[str], steps: list[Step],
                 batch: int = 0, dtype: str = "float32", interventions: list[str] | None = None):
        self.config = config
        self.axes = dict(axes)             # the whole registry
        self._names = list(recorded)
        self.steps = steps
        self.batch = batch
        self.dtype = dtype
        self.interventions = list(interventions or [])
        self.loss: float | None = None
        self.without_loss = False          # made by trace() without targets: no gradient to ask for
        self.logits: np.ndarray | None = None   # trace() keeps the forward's logits (n, V), as run_with_cache
        self.tokenizer = None              # the tokenizer that read trace()'s text, if it was given one

    def __repr__(self) -> str:
        return f"Trace({len(self._names)} names, {len(self.steps)} step(s), batch row {self.batch})"

    def names(self) -> list[str]:
        """The recorded names, in forward order."""
        return list(self._names)

    @property
    def tokens(self) -> np.ndarray:
        """The kept row's token ids of all steps, concatenated in order.

        When each step continues the one before (a prompt, then cached decoding
        steps), that is the sequence itself: id ``tokens[p]`` at position p, with
        shape (start of last step + its n,). Positions before :attr:`pad` are
        left padding (filler id 0), not text. Forwards that start again at
        position 0 are simply appended; :meth:`context` gives one step's keys.
        """
        if not self.steps:
            return np.zeros(0, dtype=np.int64)
        return np.concatenate([s.tokens for s in self.steps])

    def context(self, step: int = -1) -> np.ndarray:
        """The token ids of the keys step ``step``'s queries read, positions m - k .. m-1: (k,).

        Taken from that step and the steps just before it that it continues (each
        starting where the previous one ended), so a separate forward never lends
        its tokens. Usually k = m: the chain reaches back to position 0. It is
        shorter when the trace did not see the steps that filled the first
        positions (a cache filled before tracing): those ids are unknown.
        """
        s = self.step(step)
        first = s.index
        while first > 0 and self.steps[first - 1].start + self.steps[first - 1].n == self.steps[first].start:
            first -= 1
        ids = np.concatenate([t.tokens for t in self.steps[first: s.index + 1]])
        return ids[-s.m:]

    @property
    def pad(self) -> int:
        """How many positions at the start of the kept row are left padding (see :class:`Step`)."""
        return self.steps[0].pad if self.steps else 0

    @property
    def paths(self) -> dict:
        """Which path each layer took in the first forward: {layer name: kernel name or "reference"}.

        A layer whose snapshots were recorded ran its reference code; the others may have run a kernel
        (:func:`glassllm.kernels.plan` says which and why). Each step keeps its own, ``steps[i].paths``.
        """
        return dict(self.steps[0].paths) if self.steps else {}

    def name(self, name: str, layer=None) -> str:
        """The full name of ``name`` (with ``layer`` for a layer-local name); ValueError if unknown."""
        found = resolve(name, self.axes, layer)
        if len(found) != 1:
            raise ValueError(f"{name!r} matches {len(found)} snapshots ({found[0]}, ...); "
                             f"pass layer= or a full name")
        return found[0]

    # -- the mapping: the first forward pass ------------------------------------
    def _key(self, key) -> str:
        """The full name a mapping key stands for: a name, or (name, layer); KeyError if there is none."""
        if isinstance(key, tuple):
            if len(key) != 2:
                raise KeyError(f"a trace key is a name or (name, layer), got {key!r}")
            name, layer = key
        else:
            name, layer = key, None
        if not isinstance(name, str):
            raise KeyError(f"a trace key is a snapshot name (a str) or (name, layer), got {key!r}")
        try:
            found = resolve(name, self.axes, layer)
        except (TypeError, ValueError) as e:
            raise KeyError(str(e)) from None
        if len(found) != 1:
            raise KeyError(f"{name!r} matches {len(found)} snapshots ({found[0]}, ...); "
                           f"give a layer, trace[{name!r}, 0], or a full name")
        return found[0]

    def _first(self) -> dict:
        return self.steps[0].values if self.steps else {}

    def __getitem__(self, key) -> np.ndarray:
        full = self._key(key)
        if full not in self._first():
            raise KeyError(f"{full!r} was not recorded; this trace holds {len(self)} snapshot(s) "
                           "(pass names=None to record everything)")
        return self._first()[full]

    def __iter__(self):
        first = self._first()
        return (k for k in self._names if k in first)

    def __len__(self) -> int:
        first = self._first()
        return sum(k in first for k in self._names)

    def __contains__(self, key) -> bool:
        try:
            return self._key(key) in self._first()
        except KeyError:
            return False

    def as_transformer_lens(self, name, layer=None, step=None) -> np.ndarray:
        """Snapshot ``name`` in the layout of the TransformerLens hook holding the same numbers, batch axis first.

        The value ``cache[hook]`` of ``HookedTransformer.run_with_cache`` (or a ``TransformerBridge``) has on
        the same weights exported with ``glassllm export --format hf``: a batch axis of 1 in front, positions
        before heads (``hook_q``, ``hook_z``, ...), q and k features in split-halves order, -inf in the masked
        cells of ``hook_attn_scores`` and ``hook_scale`` as (n, 1). ``name`` may be a TransformerLens hook
        name; selection as in :meth:`get`. ValueError for a snapshot with no TransformerLens counterpart
        (``attn.mask``, ``attn.cache_k``, ``mlp.act``, ``probs``), naming it.
        """
        full = self.name(name, layer)
        if transformer_lens_name(full) is None:
            raise ValueError(f"{full!r} has no TransformerLens counterpart")
        mask = self.get(full.replace("attn.scores", "attn.mask"), step=step) if full.endswith("attn.scores") else None
        return to_transformer_lens(full, self.get(full, step=step), mask)[None]

    def step(self, step=None) -> Step:
        if step is None:
            if len(self.steps) != 1:
                raise ValueError(f"this trace has {len(self.steps)} steps: pass step=0..{len(self.steps) - 1}")
            return self.steps[0]
        if not is_int(step):
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
            if grads and self.without_loss:
                raise ValueError(f"no gradient for {full!r}: this trace was made without a loss; pass "
                                 "targets= to trace() (next-token ids; loss_at=-1 for the last position only)")
            if grads:
                raise ValueError(f"no gradient for {full!r} at step {s.index}: run the backward pass "
                                 f"inside the tracer's with-block, outside no_grad")
            raise ValueError(f"{full!r} was not recorded at step {s.index}")
        out = store[full]
        if head is not None:
            axis = head_axis(self.axes[full])
            if axis is None:
                raise ValueError(f"{full!r} has no head axis (axes {', '.join(self.axes[full])})")
            out = out.take(check_index(head, "head", out.shape[axis]), axis=axis)
            out.flags.writeable = False                                  # read-only, as every other read
        return out

    def plot(self, name: str, layer=None, head=None, step=None, grad: bool = False, tokenizer=None, ax=None):
        """Draw one matrix of snapshot ``name`` (or of its gradient) with matplotlib; returns the image.

        Selection as in :meth:`get`; see :func:`glassllm.trace.plot.plot`.
        """
        from .plot import plot

        return plot(self, name, layer, head, step, grad, tokenizer, ax)

    def show(self, tokenizer=None, *, height: int = 860):
        """The inspector inside a notebook, for this trace's first forward pass and its recorded snapshots.

        Returns a display object that Jupyter renders inline (the inspector's
        offline page in a frame: no server, no network); ``tokenizer`` labels the
        tokens. The same as ``glassllm.inspector.show(trace, tokenizer=tokenizer)``; see
        :mod:`glassllm.inspector.notebook` (needs ``glassllm-numpy[app]``).
        """
        tokenizer = self.tokenizer if tokenizer is None else tokenizer
        # The trace layer does not import the inspector (which builds on it): the viewer is the one the
        # package registered (glassllm.viewers), glassllm.inspector.show(trace).
        return viewers.trace_viewer()(self, tokenizer, height=height)

    def shape(self, name: str, layer=None, step=None) -> tuple:
        full = self.name(name, layer)
        s = self.step(step)
        return tuple(axis_sizes(self.config, s.n, s.m)[a] for a in self.axes[full])

    # -- export ----------------------------------------------------------------
    def manifest(self) -> dict:
        """The JSON description stored in a trace file (see :mod:`glassllm.trace.files`)."""
        return manifest_of(self)

    def save(self, path) -> None:
        """Write the trace to ``path`` as a ``.npz`` with ``manifest.json`` inside, atomically.

        Array members: ``values/{step}/{name}.npy`` and ``grads/{step}/{name}.npy``: the recorded
        snapshots. The file holds :attr:`logits` only as the ``logits`` snapshot, when ``names=``
        recorded it (:func:`load_trace` then sets ``logits`` from it; otherwise None).
        """
        save_trace(self, path)


def load_trace(path) -> Trace:
    """Read a trace file written by :meth:`Trace.save`; every field and array is checked.

    Raises ValueError (one line, naming the file) for anything malformed.
    """
    manifest, arrays = read_trace_file(path)
    config = ModelConfig.from_dict(manifest["config"])
    steps = []
    for i, (s, (values, grads)) in enumerate(zip(manifest["steps"], arrays)):
        steps.append(Step(i, s["n"], s["m"], s["start"], np.array(s["tokens"], dtype=np.int64),
                          values=values, grads=grads, pad=s.get("pad", 0)))
    trace = Trace(config, registry(config), manifest["names"], steps, manifest["batch"], manifest["dtype"],
                  manifest["interventions"])
    trace.loss = manifest.get("loss")
    if steps and "logits" in steps[0].values:
        trace.logits = steps[0].values["logits"]           # (n, V): what trace() hands back, when recorded
    return trace
