"""One snapshot of a :class:`~glassllm.trace.Trace` as a labelled heatmap, with matplotlib.

The picture the inspector draws, for a notebook or a script, in the same look
(:mod:`glassllm.trace.colors`): rows and columns named by their axes (queries
down and keys across for attention; positions down and features across for
vectors), token pieces on both position axes when a tokenizer is given, masked
attention cells hatched on a ground no scale uses, so a forbidden cell is never
mistaken for a weight that is merely small, a colour bar, and a scale chosen by
what the numbers are -- 0 to 1 for probabilities and attention weights, 0 to
the maximum for other values that are never negative, symmetric around 0 for
anything signed (activations, scores, gradients).

The image holds the snapshot's own numbers (``AxesImage.get_array()``),
masked cells as masked entries, so what is drawn can be checked number by
number. matplotlib is imported only when a plot is asked for: the rest of
glassllm needs NumPy alone.
"""

from __future__ import annotations

import numpy as np

from ..nn import causal_mask
from ..optional import require
from . import colors
from .registry import head_axis

# Axis letters as words, for the labels (the shape legend of glassllm.trace).
AXIS_NAMES = {"n": "position", "m": "key position", "H": "query head", "G": "key/value head",
              "D": "head feature", "C": "feature", "V": "token id", "F": "MLP feature"}

def plot(trace, name: str, layer=None, head=None, step=None, grad: bool = False, tokenizer=None, ax=None):
    """Draw snapshot ``name`` (or its gradient) of ``trace`` on ``ax``; return the ``AxesImage``.

    ``name``, ``layer``, ``head`` and ``step`` select as in :meth:`Trace.get`;
    the selection must be a matrix, so a snapshot with a head axis needs
    ``head``. ``tokenizer`` labels the position axes with token pieces.
    ``ax``: a matplotlib Axes (default: a new figure's).
    """
    plt = require("matplotlib.pyplot", "Trace.plot")

    full = trace.name(name, layer)
    s = trace.step(step)
    values = trace.grad(full, head=head, step=step) if grad else trace.get(full, head=head, step=step)
    axes = list(trace.axes[full])
    if head is not None:
        axes.pop(head_axis(trace.axes[full]))
    if values.ndim == 1:                                  # (n,), e.g. a norm's rms: one column, as the inspector shows it
        values, axes = values[:, None], [*axes, None]
    if values.ndim != 2:
        which = ", ".join(a for a in trace.axes[full])
        raise ValueError(f"{full!r} has axes ({which}): pass head= to plot one matrix of it")

    attention = axes == ["n", "m"]
    masked = _forbidden(trace, full, s) if attention else None
    if ax is None:
        ax = plt.figure(figsize=(6.4, 5.2), constrained_layout=True).add_subplot()
    image = matrix(ax, values, name=full, grad=grad, mask=masked, colorbar=False)
    if not attention:
        ax.set_aspect("auto")

    keys = trace.context(s.index)                                       # positions m - len .. m-1
    # axis letter -> (first drawn index that has a label, labels); key ids the trace never saw stay unlabelled
    labels = {"n": (0, _pieces(tokenizer, s.tokens, s.start)),
              "m": (s.m - len(keys), _pieces(tokenizer, keys, s.m - len(keys)))}
    for letter, set_label, set_ticks in ((axes[0], ax.set_ylabel, ax.set_yticks),
                                         (axes[1], ax.set_xlabel, ax.set_xticks)):
        set_label("query position" if attention and letter == "n" else AXIS_NAMES.get(letter, letter or ""))
        if tokenizer is not None and letter in labels and len(labels[letter][1]) <= 64:
            first, names = labels[letter]
            set_ticks(range(first, first + len(names)), names, fontsize=7,
                      **({"rotation": 90} if set_ticks == ax.set_xticks else {}))
    what = f"d loss / d {full}" if grad else full
    where = [f"head {head}" if head is not None else "", f"step {s.index}" if len(trace.steps) > 1 else ""]
    ax.set_title(" · ".join([what, *filter(None, where)]), fontsize=9)
    ax.figure.colorbar(image, ax=ax, shrink=0.8)
    return image


def matrix(ax, values, *, name: str = "", grad: bool = False, mask=None, rows=None, cols=None,
           colorbar: bool = True):
    """Draw one (rows, cols) matrix on ``ax`` as the inspector does; return the ``AxesImage``.

    The colour map and its range follow :func:`glassllm.trace.colors.scale`
    (``name`` is the snapshot's name, e.g. ``attn.softmax``, which selects the
    fixed 0 to 1 scale of probabilities; ``grad``: the values are a gradient).
    ``mask`` (True = forbidden) cells are hatched and left out of the scale;
    ``rows`` / ``cols`` label every row / column (token pieces, say);
    ``colorbar`` adds the colour bar (for a grid of heads, draw one for the
    figure instead: ``fig.colorbar(image, ax=axes)``). The image holds
    ``values``, masked cells as masked entries.
    """
    values = np.asarray(values, dtype=np.float64)
    if values.ndim != 2:
        raise ValueError(f"values must be a matrix (rows, cols), got shape {values.shape}")
    if mask is not None and np.shape(mask) != values.shape:
        raise ValueError(f"mask has shape {np.shape(mask)}; expected the values' {values.shape}")
    data = np.ma.masked_array(values, mask=mask if mask is not None else False)
    kind, low, high = colors.scale(values, name, grad=grad, mask=mask)
    # Masked entries take the colour map's "bad" colour, then the hatching: forbidden cells are 0 by rule,
    # not by the model's choice.
    image = ax.imshow(data, cmap=colors.colormap(kind), vmin=low, vmax=high, interpolation="nearest")
    if mask is not None:
        colors.hatch_masked(ax, mask)
    for labels, set_ticks, n, extra in ((rows, ax.set_yticks, values.shape[0], {}),
                                        (cols, ax.set_xticks, values.shape[1], {"rotation": 90})):
        if labels is not None:
            if len(labels) != n:
                raise ValueError(f"{len(labels)} labels for {n} rows or columns")
            set_ticks(range(n), list(labels), fontsize=7, **extra)
    if colorbar:
        ax.figure.colorbar(image, ax=ax, shrink=0.8)
    return image


def _forbidden(trace, full: str, s) -> np.ndarray | None:
    """The (n, m) cells an attention snapshot's queries may not read, or None when that is unknown.

    The recorded ``attn.mask`` of the layer, when the trace holds it (after any
    intervention, e.g. :class:`MaskOff`); else, for a trace without
    interventions, the model's rule: the causal mask, and the left padding.
    """
    layer = full.split(".")[1] if full.startswith("layers.") else None
    mask_name = f"layers.{layer}.attn.mask"
    if layer is not None and mask_name in s.values:
        return np.asarray(s.values[mask_name], dtype=bool)
    if trace.interventions:
        return None
    return causal_mask(s.n, s.m, s.start, np.array([s.pad]))[0]                 # (n, m)


def _pieces(tokenizer, ids, first: int) -> list[str]:
    """Tick labels for positions: ``"piece" position``, or nothing without a tokenizer."""
    if tokenizer is None:
        return []
    return [f"'{tokenizer.piece(int(i))}' {first + k}" for k, i in enumerate(ids)]
