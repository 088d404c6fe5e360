"""The views the page shows, computed from a traced pass: JSON-ready answers with exact binary floats.

Each function takes what its view reads (a :class:`~glassllm.inspector.runs.Run`, the request, the
vocabulary's pieces) and returns the answer's dict; none runs the model or checks a request
(:mod:`glassllm.inspector.runs`, :mod:`glassllm.inspector.requests`).

- :func:`info_view`: the model's shape, every snapshot name with its axes, the vocabulary and the limits;
- :func:`snapshot_view`: one (rows, cols) slice of one snapshot, with row and column labels and, for
  attention, which cells the causal mask forbids;
- :func:`heads_view`: every layer's and head's attention weights as thumbnails;
- :func:`next_view`: the last position's logits and the ids that survive top-k / top-p;
- :func:`lens_view`, :func:`attribution_view`, :func:`timeline_answer`.
"""

from __future__ import annotations

import base64

import numpy as np

from .. import kernels
from ..checks import is_int
from ..limits import parse_json
from ..sampling import sampling_distribution
from ..trace.explain import explain
from .requests import heads_of

__all__ = ["encode_array", "pool", "info_view", "snapshot_matrix", "snapshot_view", "heads_view", "timeline_answer", "next_view",
           "distribution", "lens_view", "attribution_view", "THUMB_CELLS", "GROUPS"]

# The head grid's thumbnails hold at most this many rows and columns; longer prompts are averaged in blocks.
THUMB_CELLS = 64
# Which snapshot names (without their layer prefix) the page groups under which heading.
GROUPS = (
    ("residual stream", ("resid_pre", "resid_mid", "resid_post", "embed")),
    ("attention", ("attn_norm.", "attn.")),
    ("MLP", ("mlp_norm.", "mlp.")),
    ("output", ("norm.", "logits", "probs")),
)


def encode_array(a: np.ndarray) -> dict:
    """An array as exact little-endian bytes in base64: ``{"dtype", "shape", "b64"}``.

    Floats travel bit for bit (no decimal rounding, and -inf survives), so the
    page shows exactly the numbers the tracer recorded.
    """
    a = np.asarray(a)
    kinds = {"f": {2: "float16", 4: "float32", 8: "float64"}, "b": {1: "uint8"}, "u": {1: "uint8"}}
    dtype = kinds.get(a.dtype.kind, {}).get(a.dtype.itemsize)
    if dtype is None:
        a, dtype = a.astype(np.float64), "float64"
    data = np.ascontiguousarray(a, dtype=np.dtype(dtype).newbyteorder("<"))
    return {"dtype": dtype, "shape": list(a.shape), "b64": base64.b64encode(data.tobytes()).decode("ascii")}


def pool(a: np.ndarray, mask: np.ndarray, f: int) -> tuple[np.ndarray, np.ndarray]:
    """Average (..., n, m) ``a`` over f x f blocks, leaving out the cells ``mask`` (n, m) forbids.

    Returns the (..., r, c) means (r = ceil(n / f), c = ceil(m / f); 0 where a whole block is masked)
    and the (r, c) blocks that are masked throughout.

    >>> a = np.arange(16.0).reshape(4, 4); m = np.triu(np.ones((4, 4), bool), 1)
    >>> pool(a, m, 2)[0].tolist(), pool(a, m, 2)[1].tolist()
    ([[3.0, 0.0], [10.5, 13.0]], [[False, True], [False, False]])
    """
    if f == 1:
        return np.where(mask, 0, a), mask.copy()
    n, m = mask.shape
    r, c = -(-n // f), -(-m // f)
    keep = np.zeros((r * f, c * f))
    keep[:n, :m] = ~mask
    grid = np.zeros(a.shape[:-2] + (r * f, c * f))
    grid[..., :n, :m] = np.where(mask, 0, a)
    keep = keep.reshape(r, f, c, f)                                        # (r, f, c, f)
    grid = grid.reshape(a.shape[:-2] + (r, f, c, f))                      # (..., r, f, c, f)
    count = keep.sum(axis=(1, 3))                                         # (r, c)
    total = grid.sum(axis=(-3, -1))                                       # (..., r, c)
    return np.where(count > 0, total / np.maximum(count, 1), 0), count == 0


# ----------------------------------------------------------------------------
# The page's menus
# ----------------------------------------------------------------------------

def info_view(model, tokenizer, config, axes: dict, names: list[str], vocab: list[str], meta: dict, limits,
              timeline) -> dict:
    """What the page needs to build its menus: the model, every name in ``names`` (layer-local) with its
    axes, heads, group and explanation, the vocabulary, the end ids, the timeline's size and the limits."""
    c = config
    entries = []
    for local in names:
        full = local if local in axes else f"layers.0.{local}"
        letters = axes[full]
        head_axis, heads = heads_of(letters, c)
        entries.append({
            "name": local, "axes": list(letters), "in_layer": full.startswith("layers."),
            "head_axis": head_axis, "heads": heads,
            "group": _group(local), "explain": _explain(local),
        })
    return {
        "model": {**c.to_dict(), "head_dim": c.head_dim, "params": model.num_params(),
                  "dtype": str(model.dtype)},
        "meta": {**{k: v for k, v in meta.items() if k in ("step", "valid_loss", "valid_bits_per_byte")},
                 **_earlier_steps(meta)},
        "names": entries,
        "vocab": vocab,
        "eot_id": _eot(tokenizer),
        "end_ids": list(tokenizer.end_ids),
        "tokenizer": tokenizer.kind,
        "timeline": None if timeline is None else {
            "steps": len(timeline.steps), "last": timeline.steps[-1], "tokens": len(timeline.ids)},
        "limits": {"max_prompt_tokens": limits.max_prompt_tokens,
                   "max_new_tokens": limits.max_new_tokens, "max_cells": limits.max_cells},
    }


def _earlier_steps(meta: dict) -> dict:
    """``{"steps_before": N}`` for a model whose training continued an earlier run (``--init-from``; its
    file records that run under ``base``, as the bundled model's does), else nothing."""
    if "base" not in meta:
        return {}
    try:
        base = parse_json(meta["base"], "the model file's field 'base'")
    except ValueError:
        return {}
    steps = base.get("steps") if isinstance(base, dict) else None
    return {"steps_before": str(steps)} if is_int(steps) else {}


def _explain(local: str) -> dict:
    """What the page shows beside a snapshot: its equation (LaTeX and text), the statement of ``nn.py`` that
    records it with the lines around it (:func:`glassllm.trace.explain.explain`)."""
    info = explain(local)
    return {k: info[k] for k in ("equation", "description", "path", "function", "line", "first", "last", "code",
                                 "context")}


def _group(local: str) -> str:
    for title, prefixes in GROUPS:
        if any(local == p or (p.endswith(".") and local.startswith(p)) for p in prefixes):
            return title
    return "other"


def _eot(tokenizer) -> int | None:
    try:
        return tokenizer.eot_id
    except ValueError:
        return None


# ----------------------------------------------------------------------------
# The views of one traced pass
# ----------------------------------------------------------------------------

def snapshot_matrix(run, full: str, letters, head_axis: str | None, req) -> tuple[np.ndarray, tuple]:
    """Snapshot ``full`` (axes ``letters``) of ``run`` as the heatmap's (rows, cols) matrix and the two
    axes it shows."""
    a = run.get(full, req.head, req.grad)                                # head axis dropped
    row_axes = letters[1:] if head_axis is not None else letters
    assert head_axis is None or letters[0] == head_axis
    if a.ndim == 1:
        a = a[:, None]                                                   # (n,) -> (n, 1)
        row_axes = (row_axes[0], "")
    return a, row_axes


def snapshot_view(run, full: str, req, a: np.ndarray, row_axes, heads: tuple, vocab: list[str]) -> dict:
    """The heatmap's answer: matrix ``a`` (rows, cols) of snapshot ``full`` with its labels and mask."""
    head_axis, n_heads = heads
    rows, cols = a.shape
    m = len(run.ids)
    n = m - run.start
    pieces = [vocab[i] for i in run.ids]
    labels = {"n": (pieces[run.start:], list(range(run.start, m))), "m": (pieces, list(range(m)))}
    row_labels, row_pos = labels.get(row_axes[0], ([], []))
    col_kind = {"n": "token", "m": "token", "V": "vocab", "": "none"}.get(row_axes[1], "feature")
    col_labels = labels[row_axes[1]][0] if col_kind == "token" else None

    masked = None
    if row_axes == ("n", "m") or full.endswith("attn.mask"):
        layer_mask = run.get(full.rsplit(".", 1)[0] + ".mask", None, False)  # (n, m) True = forbidden
        masked = encode_array(layer_mask.astype(np.uint8))
    return {
        "name": full, "local": req.name, "layer": req.layer, "head": req.head,
        "head_axis": head_axis, "heads": n_heads, "axes": list(row_axes), "shape": [rows, cols],
        "step": req.step, "grad": req.grad, "n": n, "m": m, "start": run.start,
        "rows": row_labels, "row_pos": row_pos, "cols": col_labels, "col_kind": col_kind,
        "values": encode_array(a), "masked": masked,
        # A plain request may be served by a cached run with gradients: its target is not this answer's.
        **_target(run, req, vocab),
    }


def _target(run, req, vocab) -> dict:
    return {"target": run.target if req.grad else None,
            "target_piece": vocab[run.target] if req.grad and run.target is not None else None}


def heads_view(run, req, config, ids: list[int], vocab: list[str]) -> dict:
    """Every layer's and head's ``attn.softmax`` (or its gradient) of the prompt's pass, as thumbnails.

    ``values``: (L, H, r, c) float32, the (n, n) patterns averaged over f x f blocks of query and key
    positions (f = ceil(n / 64), so r = c = ceil(n / f); f = 1 keeps every cell); ``masked``: (L, r, c),
    1 where every cell of a block is a forbidden key. The masked cells of ``values`` are 0.
    """
    L, n = config.n_layers, len(ids)
    f = -(-n // THUMB_CELLS)
    weights, masks = [], []
    # A lazy trace's across: what its forward and backward kept, else the weights up to each softmax, or each
    # block's forward and backward for the gradients.
    every = {}
    if hasattr(run.trace, "across"):
        every = run.trace.across("attn.mask") if req.grad else run.trace.across("attn.softmax", "attn.mask")
        if req.grad:
            grads = run.trace.across("attn.softmax", grads=True)
            every.update((k, run.checked(k, g, True)) for k, g in grads.items())
    for layer in range(L):
        a = every.get(f"layers.{layer}.attn.softmax")
        a = run.get(f"layers.{layer}.attn.softmax", None, req.grad) if a is None else a    # (H, n, n)
        mask = every.get(f"layers.{layer}.attn.mask")
        mask = run.get(f"layers.{layer}.attn.mask", None, False) if mask is None else mask  # (n, n) True = forbidden
        pooled, blocked = pool(a, mask, f)
        weights.append(pooled)
        masks.append(blocked)
    return {"layers": L, "heads": config.n_heads, "n": n, "block": f, "grad": req.grad,
            "pieces": [vocab[i] for i in ids],
            "values": encode_array(np.stack(weights).astype(np.float32)),       # (L, H, r, r)
            "masked": encode_array(np.stack(masks).astype(np.uint8)),           # (L, r, r)
            **_target(run, req, vocab)}


def timeline_answer(tl, vocab: list[str]) -> dict:
    """The run's probe history for the Training tab (see :mod:`glassllm.timeline`).

    ``attn`` (S, L, H, n, n) and ``probs`` (S, V) travel as float16 (as the file stores them),
    ``induction`` (S, L, H) as float32; ``rows``, ``history`` and ``steps`` as the file has them.
    """
    return {
        "ids": tl.ids, "pieces": [vocab[i] for i in tl.ids], "period": tl.period,
        "steps": tl.steps, "rows": tl.rows, "history": tl.history,
        "attn": encode_array(tl.attn.astype(np.float16)),                 # (S, L, H, n, n)
        "probs": encode_array(tl.probs.astype(np.float16)),               # (S, V)
        "induction": encode_array(tl.induction.astype(np.float32)),       # (S, L, H)
    }


def next_view(run, req, vocab: list[str]) -> dict:
    """The last position's logits after pass ``req.step``, with the survivors of top-k / top-p."""
    out = {"step": req.step, "position": len(run.ids) - 1, "m": len(run.ids), "start": run.start,
           "tokens": [vocab[i] for i in run.ids], "ids": run.ids,
           "paths": kernels.summary(run.trace.steps[run.step].paths),
           **distribution(run.logits, req)}
    if req.step:
        out["fed"] = {"id": run.ids[-1], "piece": vocab[run.ids[-1]]}
    return out


def distribution(logits: np.ndarray, req) -> dict:
    """``logits`` (V,), their sampling distribution under the request's temperature, top_k and top_p, and
    the ids that survive, most likely first."""
    dist = sampling_distribution(logits, req.temperature, req.top_k, req.top_p)  # (V,) float64
    survivors = np.flatnonzero(dist > 0)
    survivors = survivors[np.lexsort((survivors, -dist[survivors]))]
    return {"logits": encode_array(logits), "sampled": encode_array(dist),
            "survivors": [int(i) for i in survivors]}


def lens_view(top, prob, ids: list[int], vocab: list[str], earlier=None, later=None) -> dict:
    """The logit lens's answer from :func:`glassllm.trace.lens_top`'s ``top`` ids and ``prob`` over one
    window of positions: ``positions`` ``[start, stop)`` of ``length`` (every position's piece is in
    ``pieces``), and the windows the page's buttons move to (``earlier``, ``later``: None at an end)."""
    rows = np.asarray(top).tolist()                                      # (L+1, w) token ids
    start, stop = top.baseline.get("positions", (0, len(ids)))
    return {"streams": list(top.labels[0]), "pieces": [vocab[i] for i in ids], "top": rows,
            "top_pieces": [[vocab[i] for i in row] for row in rows],
            "prob": np.asarray(prob, dtype=np.float64).tolist(),
            "positions": [start, stop], "length": len(ids), "earlier": earlier, "later": later}


def attribution_view(bars, position: int, ids: list[int], vocab: list[str]) -> dict:
    """Direct logit attribution's answer from :func:`glassllm.trace.direct_attribution`'s ``bars``."""
    token = bars.baseline["token"]
    return {"labels": bars.labels[0], "values": np.asarray(bars, dtype=np.float64).tolist(),
            "total": bars.baseline["total"], "token": token, "piece": vocab[token],
            "position": position, "pieces": [vocab[i] for i in ids]}
