"""The inspector inside Jupyter: the offline page of one prompt, inline in an output cell.

``glassllm.show(prompt)`` returns an :class:`InlineView`, which a notebook
displays as the inspector itself: the self-contained page of
``glassllm inspect PROMPT --html FILE`` (:mod:`.export`) inside an
``<iframe srcdoc=...>``. It needs no server and no network: the page carries
its script, its style and the answers its controls ask for, and its
Content-Security-Policy forbids every request. The frame is sandboxed (scripts,
and downloads for its Save buttons), so the page cannot reach the notebook around it.

A notebook keeps its outputs, so the inline page holds fewer views than a
``--html`` file by default: the attention snapshots (q, k, v, scores, mask,
weights, output) and each block's output on the residual stream, values and
gradients; the next-token distribution; two greedy steps; and no
interventions (``interventions=True`` adds them). The page lists only the views
it holds and says how to include the rest; ``glassllm inspect`` shows them all.
The display also carries a PNG of the first view (:func:`first_view_png`), which
a notebook shows where the page's script cannot run.

:meth:`Trace.show <glassllm.trace.Trace.show>` shows a trace already
recorded, with its own numbers (and whatever interventions made them): the
page's views are the trace's recorded snapshots of its first forward pass.

:func:`show_attention` shows attention weights of any model, given as arrays
with their token strings (as BertViz's ``head_view`` and CircuitsVis take
them): the same heatmap, head grid and hover values.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re

import numpy as np

from ..checkpoint import atomic_write
from ..checks import check_int
from ..nn import causal_mask
from ..optional import require
from ..trace import trace as run_trace
from ..trace.registry import resolve
from .data import Inspector
from .export import build_responses, render_html
from .schema import Limits, PromptRequest, describe_validation_error, shown

ValidationError = require("pydantic", "the inspector").ValidationError

__all__ = ["INLINE_NAMES", "InlineView", "show", "show_attention", "show_trace"]

# The views an inline page holds by default (layer-local names), values and gradients.
INLINE_NAMES = frozenset({
    "attn.q", "attn.k", "attn.v", "attn.scores", "attn.mask", "attn.softmax", "attn.out", "resid_post",
})


class InlineView:
    """The inspector's self-contained page, displayed inline by Jupyter (``_repr_html_``).

    ``page``: the whole HTML document; ``height``: the frame's height in pixels.
    :meth:`save` writes the page as a file that opens in any browser.
    """

    def __init__(self, page: str, title: str, height: int = 860, png: bytes | None = None):
        height = check_int("height", height, low=200, high=4000, note="pixels")
        self.page, self.title, self.height, self.png = page, title, height, png

    def __repr__(self) -> str:
        return f"InlineView({self.title!r}, {len(self.page.encode('utf-8')):,} bytes)"

    def _repr_html_(self) -> str:
        # srcdoc is an attribute: the page is escaped once, quotes included, and the browser unescapes it.
        return (f'<iframe class="glassllm-inspector" title="{html.escape(self.title, quote=True)}" '
                f'sandbox="allow-scripts allow-downloads" srcdoc="{html.escape(self.page, quote=True)}" '
                f'style="width: 100%; height: {self.height}px; border: 1px solid #ccc;"></iframe>')

    def _repr_mimebundle_(self, include=None, exclude=None) -> dict:
        # The PNG of the first view is the static fallback: a notebook opened where its HTML may not run
        # scripts (JupyterLab shows an untrusted notebook's outputs only in their safe types) shows the picture.
        bundle = {"text/html": self._repr_html_(), "text/plain": repr(self)}
        if self.png is not None:
            bundle["image/png"] = base64.b64encode(self.png).decode("ascii")
        return bundle

    def save(self, path) -> None:
        """Write the page to ``path`` (atomically): the same file as ``glassllm inspect --html``."""
        atomic_write(path, self.page.encode("utf-8"))


def _model_and_tokenizer(model, tokenizer):
    from ..checkpoint import load_bundled, load_model

    if model is None:
        if tokenizer is not None:
            raise ValueError("tokenizer= goes with model=; without a model the bundled one brings its own")
        return load_bundled()
    if isinstance(model, (str, os.PathLike)):
        if tokenizer is not None:
            raise ValueError("tokenizer= goes with a model object; a model file brings its own")
        return load_model(model)
    if tokenizer is None:
        raise ValueError("model= is a model object: pass its tokenizer= too (or give a model file's path)")
    return model, tokenizer, {}


def _keep(key: str, names, interventions: bool) -> bool:
    """Whether an inline page keeps the answer stored under request ``key``."""
    kind, body = key.split(":", 1)
    body = json.loads(body)
    if body.get("intervention") and not interventions:
        return False
    return kind != "snapshot" or body.get("name") in names


def show(prompt: str, model=None, tokenizer=None, *, steps: int = 2, names=INLINE_NAMES,
         interventions: bool = False, height: int = 860, live: bool = False):
    """The inspector for ``prompt``, inline in a notebook: ``glassllm.show("Once upon a time")``.

    ``live=True``: a widget whose every request the kernel computes
    (:class:`~glassllm.inspector.live.LiveView`; needs the ``notebook`` extra): nothing is
    precomputed, so any layer, intervention or decoding step can be asked for, while the kernel runs
    (``steps``, ``names`` and ``interventions`` are for the offline page only).

    ``model``: None (the bundled model), a model file's path, or a
    :class:`~glassllm.nn.Transformer` with its ``tokenizer``. ``steps``: greedy
    decoding steps to include; ``names``: the snapshots to include (layer-local
    names such as ``attn.softmax``, globs such as ``attn.*`` or TransformerLens hook names
    such as ``attn.hook_pattern``, each shown in every layer; None: all); ``interventions``: include head
    ablations, mask switches and score temperatures. Raises ``ValueError`` for a
    prompt the inspector refuses or a bad argument.
    """
    try:
        PromptRequest(prompt=prompt)                      # the server's checks, and its messages
    except ValidationError as e:
        raise ValueError(describe_validation_error(e.errors())) from None
    if not isinstance(live, bool):
        raise ValueError(f"live must be True or False, got {live!r}")
    if live:
        from .live import LiveView                         # MissingExtra (one line) without anywidget
        model, tokenizer, meta = _model_and_tokenizer(model, tokenizer)
        inspector = Inspector(model, tokenizer, meta=meta)
        inspector.encode(prompt)                           # too long: the inspector's own message
        return LiveView(inspector, prompt, height)
    model, tokenizer, meta = _model_and_tokenizer(model, tokenizer)
    inspector = (Inspector if interventions else _NoInterventions)(model, tokenizer, meta=meta)
    limit = inspector.limits.max_new_tokens
    steps = check_int("steps", steps, low=0, high=limit)
    names = _check_names(names, inspector.local_names(), inspector.axes)
    inspector.encode(prompt)                               # too long: the inspector's own message
    responses = build_responses(inspector, prompt, steps)
    kept = {k: v for k, v in responses.items() if _keep(k, names, interventions)}
    info = inspector.info()
    # What the page holds, so that it lists only that and says how to include the rest.
    info["offline"] = {"held": [n for n in inspector.local_names() if n in names], "interventions": interventions,
                       "more_names": "glassllm.show(prompt, names=None) includes every snapshot",
                       "more_interventions": "glassllm.show(prompt, interventions=True) includes head ablations, "
                                             "the mask switch and score temperatures"}
    png = first_view_png(run_trace(model, inspector.encode(prompt), names=[_first_view(names)]), _first_view(names),
                         tokenizer)
    return InlineView(render_html(info, prompt, kept), f"glassllm inspector: {prompt[:60]}", height, png)


def _first_view(held) -> str:
    """The snapshot the page opens on: attention weights when held, else the first held name."""
    return "attn.softmax" if "attn.softmax" in held else sorted(held)[0]


def first_layer(recorded, local: str) -> int:
    """The first layer in which the trace ``recorded`` holds the layer-local name ``local``: the page opens there
    (0 for a name outside the layers)."""
    held = set(recorded.names())
    return next((i for i in range(recorded.config.n_layers) if f"layers.{i}.{local}" in held), 0)


def first_view_png(recorded, local: str, tokenizer=None) -> bytes:
    """The page's first view (the first layer holding ``local``, head 0) of a trace, drawn by :meth:`Trace.plot`
    as PNG bytes."""
    Figure = require("matplotlib.figure", "the notebook view's static picture").Figure   # no pyplot: no backend

    full = local if local in recorded.axes else f"layers.{first_layer(recorded, local)}.{local}"
    head = 0 if any(a in ("H", "G") for a in recorded.axes[full]) else None
    ax = Figure(figsize=(6.4, 5.2), dpi=80, constrained_layout=True).add_subplot()
    recorded.plot(full, head=head, step=0, tokenizer=tokenizer, ax=ax)
    ax.set_title(f"{full}{'' if head is None else f', head {head}'}  -- a picture: trust or run the notebook for the inspector",
                 fontsize=9)
    buf = io.BytesIO()
    ax.figure.savefig(buf, format="png")
    return buf.getvalue()


class _NoInterventions(Inspector):
    """An inspector that refuses interventions at once, so that an inline page does not compute them."""

    def _check_intervention(self, iv, n: int) -> None:
        if iv is not None:
            raise ValueError("this inline page holds no interventions: glassllm.show(..., interventions=True)")
        super()._check_intervention(iv, n)


def _check_names(names, known: list[str], axes: dict) -> set[str]:
    """The page's names (layer-local) that ``names`` choose: each a page name, a glob of them (``attn.*``) or
    a TransformerLens hook name without its block (``attn.hook_pattern``, ``pattern``). The page shows a
    chosen name in every layer, so a name with its layer (``layers.2.attn.softmax``) is refused."""
    if names is None:
        return set(known)
    if isinstance(names, str):
        names = [names]
    chosen, unknown = set(), []
    for name in names:
        if not isinstance(name, str):
            raise ValueError(f"names must be snapshot names (str), got {name!r}")
        found = []
        if name in known:
            found = [name]
        elif not re.match(r"(layers|blocks)\.\d+\.", name):
            try:
                found = resolve(name, axes)
            except ValueError:
                pass
        local = {k.split(".", 2)[2] if k.startswith("layers.") else k for k in found} & set(known)
        chosen |= local
        if not local:
            unknown.append(name)
    if unknown:
        raise ValueError(f"unknown snapshot name(s) {', '.join(map(repr, sorted(unknown)))}; expected layer-local "
                         f"names such as 'attn.softmax' (or 'attn.*', or TransformerLens' 'attn.hook_pattern'), "
                         f"one of: {', '.join(known)}")
    return chosen


class _Recorded(Inspector):
    """The page's answers read from a recorded trace (its first forward pass) instead of a model."""

    def __init__(self, trace, tokenizer=None):
        self.model, self.tokenizer = _Shape(trace), tokenizer if tokenizer is not None else _NoTokenizer()
        self.config = trace.config
        self.limits = Limits().fit(trace.config.max_seq_len)
        self.meta = {}
        self.axes = dict(trace.axes)
        self.run = _RecordedRun(trace)
        self.ids = self.run.ids
        V = trace.config.vocab_size
        self._vocab = tokenizer.pieces(range(V)) if tokenizer is not None else [f"id {i}" for i in range(V)]
        self.recorded = set(trace.names())

    def local_names(self) -> list[str]:
        """The names recorded in at least one layer (or outside the layers)."""
        L = self.config.n_layers
        return [n for n in super().local_names()
                if n in self.recorded or any(f"layers.{i}.{n}" in self.recorded for i in range(L))]

    def encode(self, prompt: str) -> list[int]:
        return list(self.ids)

    def check_pass(self, prompt: str) -> None:
        self.encode(prompt)                                  # the recorded pass was checked when it was made

    def next_token(self, req):
        if self.run.logits is None:
            raise ValueError("this trace did not record 'logits': trace it with names including 'logits'")
        return super().next_token(req)

    def _finished(self, ids, step, run):
        return "this view shows a recorded trace: decoding steps need glassllm.show(prompt)"

    def lens(self, req):
        raise ValueError("this view shows a recorded trace: the logit lens needs glassllm.show(prompt)")

    def attribution(self, req):
        raise ValueError("this view shows a recorded trace: attribution needs glassllm.show(prompt)")

    def _run_for(self, ids, step, iv, target, grad):
        if iv is not None or step:
            raise ValueError("this view shows a recorded trace: interventions and decoding need glassllm.show(prompt)")
        if grad and not self.run.has_grads:
            raise ValueError("this trace has no gradients: trace it with targets= to record them")
        return self.run


class _RecordedRun:
    """The trace's first forward pass, read as the inspector reads one of its own runs."""

    def __init__(self, trace):
        first = trace.steps[0]
        self.trace, self.step, self.target, self.start = trace, 0, None, first.start
        self.ids = [int(i) for i in first.tokens]
        self.has_grads = bool(first.grads)
        self.logits = trace.get("logits", step=0)[-1] if "logits" in trace.names() else None   # (V,)
        self.first = first

    def get(self, full: str, head, grad: bool) -> np.ndarray:
        if full.endswith(".attn.mask") and full not in self.trace.names():
            # Not recorded: the model's rule (the causal mask and the left padding), unless an
            # intervention may have changed it.
            if self.trace.interventions:
                raise ValueError(f"{full!r} was not recorded and interventions may have changed it: "
                                 "trace it with names including 'attn.mask'")
            s = self.first
            return causal_mask(s.n, s.m, s.start, np.array([s.pad]))[0]               # (n, m)
        read = self.trace.grad if grad else self.trace.get
        return read(full, head=head, step=0)


class _NoTokenizer:
    """Stands in for a tokenizer the trace was shown without: ids only, no end-of-text id."""

    eot_id = None
    end_ids = ()
    kind = "ids"


class _Shape:
    """What the page's header says about the model a trace came from."""

    def __init__(self, trace):
        self.dtype = trace.dtype
        self._config = trace.config

    def num_params(self) -> int:
        c = self._config
        D, C, F, V = c.head_dim, c.dim, c.ffn_dim, c.vocab_size
        per_layer = 2 * C * c.n_heads * D + 2 * C * c.n_kv_heads * D + 3 * C * F + 2 * C   # wq wo, wk wv, MLP, norms
        return c.n_layers * per_layer + C + 2 * V * C                                       # final norm, embeddings, output


def show_trace(trace, tokenizer=None, *, height: int = 860) -> InlineView:
    """The inspector for a recorded :class:`~glassllm.trace.Trace`, inline: its own snapshots."""
    if not trace.steps:
        raise ValueError("this trace recorded no forward pass: nothing to show")
    if tokenizer is not None and tokenizer.vocab_size != trace.config.vocab_size:
        raise ValueError(f"tokenizer has {tokenizer.vocab_size} ids but the trace's model has "
                         f"{trace.config.vocab_size}")
    source = _Recorded(trace, tokenizer)
    ids = source.ids
    text = tokenizer.decode(ids) if tokenizer is not None else " ".join(f"id {i}" for i in ids)
    return _recorded_view(source, text, f"glassllm trace: {len(ids)} tokens, {len(source.recorded)} snapshots",
                          height)


def _recorded_view(source: "_Recorded", text: str, title: str, height: int) -> InlineView:
    """The page of a recorded pass: its views' answers (a view's error kept for the page to show), no interventions,
    and the picture of its first view (the static fallback)."""
    responses = build_responses(source, text, 0)
    held = set(source.local_names())
    kept = {k: v for k, v in responses.items() if "error" not in v or k.startswith("snapshot")}
    kept = {k: v for k, v in kept.items() if _keep(k, held, False)}
    tokenizer = None if isinstance(source.tokenizer, _NoTokenizer) else source.tokenizer
    png = first_view_png(source.run.trace, _first_view(held), tokenizer)
    info = {**source.info(), "first_layer": first_layer(source.run.trace, _first_view(held))}
    return InlineView(render_html(info, text, kept), title, height, png)


# ---------------------------------------------------------------------------------------------- arrays of any model

def show_attention(attention, tokens, *, mask=None, height: int = 860) -> InlineView:
    """Attention weights of any model in the inspector's heatmap and head grid, offline: a notebook cell or a file.

    ``attention``: (H, n, n) for one layer or (L, H, n, n) -- a NumPy array or anything with ``__array__``
    (a PyTorch tensor on the CPU, TransformerLens' ``cache["pattern", 0][0]``); weights of query i
    (rows) over key j (columns), finite. ``tokens``: the n token strings (``model.to_str_tokens(text)``).
    ``mask``: (n, n) or (L, n, n) booleans, True where a query may not read the key; by default inferred:
    a layer whose weights are all exactly 0 above the diagonal is causal, else nothing is masked.
    Returns an :class:`InlineView` (shown inline by Jupyter; ``.save(path)`` writes the HTML file);
    hovering a cell shows the array's own number. ValueError (one line) for anything else.

    >>> view = show_attention(np.full((2, 3, 3), 1 / 3), ["a", "b", "c"])
    >>> view.title
    'attention: 1 layer, 2 heads, 3 tokens'
    """
    from ..config import ModelConfig
    from ..trace.record import Step, Trace
    from ..trace.registry import registry

    a = _attention_array(attention)
    L, H, n, _ = a.shape
    if isinstance(tokens, str) or not isinstance(tokens, (list, tuple)) or not all(isinstance(t, str) for t in tokens):
        raise ValueError(f"tokens must be a list of {n} strings, one per position, got {shown(tokens)}")
    if len(tokens) != n:
        raise ValueError(f"tokens has {len(tokens)} strings but the attention covers {n} positions")
    masks = _attention_mask(mask, a)                                        # (L, n, n) True = may not read
    config = ModelConfig(vocab_size=n, dim=2 * H, n_layers=L, n_heads=H, n_kv_heads=H, ffn_dim=1, max_seq_len=n + 1)
    values = {}
    for i in range(L):
        values[f"layers.{i}.attn.mask"], values[f"layers.{i}.attn.softmax"] = masks[i], a[i]
    for v in values.values():
        v.flags.writeable = False
    step = Step(0, n, n, 0, np.arange(n), values=values)
    trace = Trace(config, registry(config), list(values), [step], dtype=a.dtype.name)
    source = _GivenAttention(trace, _Pieces(list(tokens)))
    title = f"attention: {L} layer{'s' * (L != 1)}, {H} head{'s' * (H != 1)}, {n} token{'s' * (n != 1)}"
    return _recorded_view(source, "".join(tokens), title, height)


def _attention_array(attention) -> np.ndarray:
    """``attention`` as a float32/float64 array (L, H, n, n), checked."""
    if isinstance(attention, (str, bytes, dict)) or attention is None:
        raise ValueError(f"attention must be an array (H, n, n) or (L, H, n, n), got {type(attention).__name__}")
    try:
        a = np.asarray(attention)
    except (TypeError, ValueError, RuntimeError) as e:
        raise ValueError(f"attention must be an array (H, n, n) or (L, H, n, n); "
                         f"{type(attention).__name__} does not convert: {str(e).splitlines()[0]}") from None
    if a.dtype.kind not in "biuf":
        raise ValueError(f"attention must hold real numbers, got {a.dtype}")
    if a.ndim == 3:
        a = a[None]
    if a.ndim != 4 or a.shape[-1] != a.shape[-2] or 0 in a.shape:
        raise ValueError(f"attention must be (H, n, n) or (L, H, n, n): queries by the same keys, got shape "
                         f"{np.shape(attention)}")
    a = a.astype(a.dtype if a.dtype in (np.float32, np.float64) else np.float64)
    if not np.isfinite(a).all():
        raise ValueError("attention has NaN or infinite values: give the weights after the softmax (finite)")
    return np.ascontiguousarray(a)


def _attention_mask(mask, a: np.ndarray) -> np.ndarray:
    """(L, n, n) booleans, True where a query may not read the key: given, or inferred from exact zeros."""
    L, _, n, _ = a.shape
    future = np.triu(np.ones((n, n), dtype=bool), k=1)
    if mask is None:
        causal = ~(a[:, :, future] != 0).any(axis=(1, 2))                 # (L,) all zero above the diagonal
        return np.stack([future if c else np.zeros((n, n), dtype=bool) for c in causal])
    m = np.asarray(mask)
    if m.dtype != np.bool_:
        raise ValueError(f"mask must be booleans (True where a query may not read the key), got {m.dtype}")
    if m.shape == (n, n):
        m = np.broadcast_to(m, (L, n, n))
    if m.shape != (L, n, n):
        raise ValueError(f"mask must be (n, n) or (L, n, n) = ({L}, {n}, {n}), got shape {m.shape}")
    return np.array(m)


class _Pieces:
    """A tokenizer stand-in whose id i is position i, its piece the given token string."""

    eot_id = None
    end_ids = ()
    kind = "pieces"

    def __init__(self, tokens: list[str]):
        self.tokens, self.vocab_size = tokens, len(tokens)

    def piece(self, i: int) -> str:
        return self.tokens[i]

    def pieces(self, ids) -> list[str]:
        return [self.tokens[i] for i in ids]


class _GivenAttention(_Recorded):
    """The page's answers for attention weights given as arrays: the heatmap and the head grid, nothing else."""

    def info(self) -> dict:
        out = super().info()
        c = self.config
        out["source"] = {"kind": "arrays", "layers": c.n_layers, "heads": c.n_heads, "tokens": c.vocab_size}
        return out

    def _run_for(self, ids, step, iv, target, grad):
        if grad:
            raise ValueError("attention weights given as arrays have no gradients")
        return super()._run_for(ids, step, iv, target, grad)
