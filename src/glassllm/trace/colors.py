"""One look for every figure: the colour maps, the hatching of masked cells and the choice of scale.

The inspector's page, :meth:`Trace.plot <glassllm.trace.Trace.plot>` and the
notebooks draw snapshots the same way, from the definitions here:

- :data:`SEQUENTIAL` (white to ink blue) for weights and probabilities, on a
  fixed 0 to 1 scale, and for other values that are never negative (0 to max);
- :data:`DIVERGING` (blue, white at 0, red) for signed values and every
  gradient, on a scale symmetric around 0;
- masked cells (keys a query may not read) on the ground :data:`MASKED`, which
  neither map comes near, hatched with rising lines (:data:`HATCH`): a forbidden
  cell never looks like a weight that is merely small.

The page gets these numbers from Python (:func:`page_json`, embedded by the
server and by the export), so there is one copy of them; matplotlib gets them
through :func:`colormap` and :func:`hatch_masked`. matplotlib is imported only
when those are called.
"""

from __future__ import annotations

import json

import numpy as np

from ..optional import require

__all__ = ["SEQUENTIAL", "DIVERGING", "MASKED", "HATCH", "PROBABILITIES", "page_json", "scale",
           "colormap", "hatch_masked"]

# Colour stops, evenly spaced from the low end of a scale to the high end (RGB, 0-255).
SEQUENTIAL = ((255, 255, 255), (198, 219, 239), (107, 174, 214), (33, 113, 181), (8, 48, 107))
DIVERGING = ((33, 102, 172), (146, 197, 222), (247, 247, 247), (244, 165, 130), (178, 24, 43))
# A masked cell's ground, and the hatching drawn over it: lines rising left to right, `spacing` pixels apart.
MASKED = (214, 210, 200)
HATCH = {"rgb": (120, 112, 96), "alpha": 0.55, "spacing": 6}

# Snapshots (layer-local names) whose values are probabilities or a mask: the fixed 0 to 1 scale.
PROBABILITIES = ("attn.softmax", "probs", "attn.mask")


def page_json() -> str:
    """The definitions above as the JSON object the inspector's page reads."""
    return json.dumps({"sequential": SEQUENTIAL, "diverging": DIVERGING, "masked": MASKED, "hatch": HATCH},
                      separators=(",", ":"))


def scale(values, name: str, grad: bool = False, mask=None) -> tuple[str, float, float]:
    """Which map, and its low and high ends, for ``values`` of snapshot ``name``: ``(kind, lo, hi)``.

    ``kind`` is ``"sequential"`` or ``"diverging"``. Probabilities and masks
    (not their gradients) take 0 to 1; other values that are never negative take
    0 to their maximum; everything else (and every gradient) is symmetric around
    0. Cells where ``mask`` is True and values that are not finite are left out.
    """
    if not grad and name.endswith(PROBABILITIES):
        return "sequential", 0.0, 1.0
    v = np.asarray(values, dtype=np.float64)
    keep = np.isfinite(v)
    if mask is not None:
        keep &= ~np.asarray(mask, dtype=bool)
    if not keep.any():
        return "sequential", 0.0, 1.0
    lo, hi = float(v[keep].min()), float(v[keep].max())
    if lo >= 0 and not grad:
        return "sequential", 0.0, hi or 1.0
    top = max(abs(lo), abs(hi)) or 1.0
    return "diverging", -top, top


def colormap(kind: str):
    """The matplotlib colour map ``"sequential"`` or ``"diverging"``, made from the stops above."""
    LinearSegmentedColormap = require("matplotlib.colors", "a colour map").LinearSegmentedColormap

    stops = {"sequential": SEQUENTIAL, "diverging": DIVERGING}.get(kind)
    if stops is None:
        raise ValueError(f"kind must be 'sequential' or 'diverging', got {kind!r}")
    cmap = LinearSegmentedColormap.from_list(f"glassllm-{kind}", [tuple(c / 255 for c in s) for s in stops], N=256)
    return cmap.with_extremes(bad=tuple(c / 255 for c in MASKED))


def hatch_masked(ax, mask) -> list:
    """Hatch the True cells of ``mask`` (rows, cols) on ``ax``, drawn by ``imshow`` at integer centres.

    Each row's runs of masked cells become one rectangle on the :data:`MASKED`
    ground, hatched in the :data:`HATCH` colour. Returns the rectangles.
    """
    Rectangle = require("matplotlib.patches", "hatching masked cells").Rectangle

    mask = np.asarray(mask, dtype=bool)
    ground = tuple(c / 255 for c in MASKED)
    lines = (*(c / 255 for c in HATCH["rgb"]), HATCH["alpha"])
    patches = []
    for i, row in enumerate(mask):
        edges = np.flatnonzero(np.diff(np.concatenate([[0], row.astype(np.int8), [0]])))  # run starts, ends
        for start, end in zip(edges[::2], edges[1::2]):
            rect = Rectangle((start - 0.5, i - 0.5), end - start, 1, facecolor=ground, edgecolor=lines,
                             hatch="///", linewidth=0)
            ax.add_patch(rect)
            patches.append(rect)
    return patches
