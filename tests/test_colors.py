"""One look for every figure: the inspector's page and Trace.plot draw from glassllm.trace.colors.

The page gets the stops, the masked cells' ground and the hatching from Python
(embedded in index.html by the server and by the export), and the page's scripts define
none of its own; Trace.plot uses colour maps built from the same stops, the
same rule for the scale, and hatches the same cells.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from glassllm.trace import colors, trace
from tests.support.glassllm_testing import TINY

STATIC = Path(__file__).resolve().parents[1] / "src" / "glassllm" / "inspector" / "static"
PALETTE = re.compile(r'<script id="glass-colors" type="application/json">(.*?)</script>', re.S)


def _want() -> dict:
    return {"sequential": [list(c) for c in colors.SEQUENTIAL], "diverging": [list(c) for c in colors.DIVERGING],
            "masked": list(colors.MASKED), "hatch": {**colors.HATCH, "rgb": list(colors.HATCH["rgb"])}}


def test_the_page_served_and_exported_carries_the_python_definitions():
    pytest.importorskip("fastapi")
    from glassllm.inspector.assets import SCRIPTS, script_tag
    from glassllm.inspector.export import render_html
    from glassllm.inspector.server import read_assets

    served = read_assets()["index.html"]
    exported = render_html({}, "x", {})
    for page in (served, exported):
        (found,) = PALETTE.findall(page)
        assert json.loads(found) == _want()
    assert served.index('id="glass-colors"') < served.index(script_tag(SCRIPTS[0]))   # read before the scripts


def test_the_page_script_and_style_define_no_colours_of_their_own():
    from glassllm.inspector.assets import SCRIPTS

    scripts = {name: (STATIC / name).read_text(encoding="utf-8") for name in SCRIPTS}
    assert any('getElementById("glass-colors")' in text for text in scripts.values())
    for name, text in scripts.items():
        triples = re.findall(r"\[\s*\d{1,3}\s*,\s*\d{1,3}\s*,\s*\d{1,3}\s*\]", text)
        assert not triples, f"{name} spells colour stops itself: {triples}"
    # The legend's masked swatch (CSS) shows the same ground as the heatmap's masked cells.
    css = (STATIC / "style.css").read_text(encoding="utf-8")
    (swatch,) = re.findall(r"\.swatch\.masked\s*\{[^}]*\}", css)
    assert "#%02x%02x%02x" % colors.MASKED in swatch


def test_the_matplotlib_maps_are_made_of_the_same_stops():
    pytest.importorskip("matplotlib")
    for kind, stops in (("sequential", colors.SEQUENTIAL), ("diverging", colors.DIVERGING)):
        cmap = colors.colormap(kind)
        # js/paint.js's ramp(): 256 entries, entry i at i / 255 of the way, linear between evenly spaced stops.
        stops = np.array(stops, dtype=float)
        t = np.arange(256) / 255 * (len(stops) - 1)
        k = np.minimum(np.floor(t).astype(int), len(stops) - 2)
        page = stops[k] + (stops[k + 1] - stops[k]) * (t - k)[:, None]
        np.testing.assert_allclose(cmap(np.arange(256))[:, :3] * 255, page, atol=1e-6)
        np.testing.assert_allclose(np.array(cmap.get_bad()[:3]) * 255, colors.MASKED, atol=1e-9)
    with pytest.raises(ValueError, match="kind must be 'sequential' or 'diverging', got 'viridis'"):
        colors.colormap("viridis")


def test_the_scale_follows_what_the_numbers_are():
    w = np.array([[1.0, 0.0], [0.3, 0.7]])
    assert colors.scale(w, "layers.0.attn.softmax") == ("sequential", 0.0, 1.0)
    assert colors.scale(w, "layers.0.attn.softmax", grad=True) == ("diverging", -1.0, 1.0)
    assert colors.scale(np.array([0.5, 2.0]), "layers.0.mlp.act") == ("sequential", 0.0, 2.0)
    assert colors.scale(np.array([-3.0, 2.0]), "embed") == ("diverging", -3.0, 3.0)
    scores = np.array([[1.0, -np.inf], [-2.0, 0.5]])
    mask = np.array([[False, True], [False, False]])
    assert colors.scale(scores, "layers.1.attn.scores", mask=mask) == ("diverging", -2.0, 2.0)
    assert colors.scale(np.full((2, 2), np.nan), "embed") == ("sequential", 0.0, 1.0)


def test_plot_uses_the_shared_maps_and_hatches_exactly_the_masked_cells(tiny_model):
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Rectangle

    ids = np.arange(3, 9)
    t = trace(tiny_model, ids, names=["attn.softmax", "layers.0.resid_post"])
    fig, ax = plt.subplots()
    image = t.plot("attn.softmax", layer=0, head=0, ax=ax)
    assert image.cmap.name == "glassllm-sequential"
    hatched = np.zeros((6, 6), dtype=bool)
    rects = [p for p in ax.patches if isinstance(p, Rectangle) and p.get_hatch()]
    for r in rects:
        (x, y), w = r.get_xy(), r.get_width()
        hatched[int(y + 0.5), int(x + 0.5):int(x + 0.5 + w)] = True
    np.testing.assert_array_equal(hatched, np.triu(np.ones((6, 6), dtype=bool), k=1))
    assert len(rects) == 5                                         # one run per row that has a masked cell
    np.testing.assert_allclose(np.array(rects[0].get_facecolor()[:3]) * 255, colors.MASKED)
    assert len(fig.axes) == 2                                      # the heatmap and its colour bar
    assert t.plot("layers.0.resid_post", ax=plt.subplots()[1]).cmap.name == "glassllm-diverging"
    plt.close("all")


@pytest.fixture
def tiny_model():
    from glassllm.nn import Transformer

    return Transformer(TINY, seed=0)
