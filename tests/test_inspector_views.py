"""The inspector's whole-model views and reading aids, in Chromium (Playwright), against the tracer.

- the model map lists every registry name of a layer, each with its shape for the prompt, and opens it;
  a name the registry gains appears on the map by itself;
- the head grid shows L x H thumbnails of ``attn.softmax`` (and of its gradient) with the tracer's
  numbers, names the head under the mouse, and opens the head clicked;
- next-token bars are on an absolute 0 ... 1 scale (the top bar shortens as the temperature rises);
- the legend and the help text name the same colour scale for every view;
- row labels stay in sight when a wide heatmap is scrolled sideways;
- hover values are shown at the precision of the dtype (float32: at most 9 digits);
- an intervention shows its view before and after, side by side, with their difference, and says what
  an ablation changes and what it leaves;
- a busy server (503) or a rate limit (429) shows "busy, retrying", and the page asks again after
  ``Retry-After`` and shows its view.

Fixtures (Chromium, the model, the live server) come from ``test_inspector_browser``: the same launch
flags, and the same ``GLASSLLM_REQUIRE_BROWSER`` rule (skip without a browser, unless CI requires one).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from tests.test_inspector_browser import browser, heatmap, hover, idle, inspector, opened, parts, server, traced  # noqa: F401

pytestmark = pytest.mark.browser

PROMPT = "Once upon a time"   # the server fixture's opening prompt


def _ids(parts):
    return parts[1].encode(PROMPT, allowed_special="all")


def test_the_model_map_lists_every_name_of_a_layer_with_its_shape_and_opens_it(browser, server, parts):
    from glassllm.trace import registry
    from glassllm.trace.registry import snapshot_shape

    model = parts[0]
    page = opened(browser, server.url, "{name: 'attn.softmax', layer: 2, head: 1}")
    page.evaluate("() => window.glass.tab('map')")
    nodes = page.eval_on_selector_all("#model-map .map-node[data-full]",
                                      "els => els.map(e => [e.dataset.full, e.dataset.shape])")
    n = len(_ids(parts))
    want = [k for k in registry(model) if k.startswith("layers.2.") or not k.startswith("layers.")]
    assert [full for full, _ in nodes] == want                          # every name, in forward order
    for full, shape in nodes:
        assert tuple(int(s) for s in shape.split(",")) == snapshot_shape(full, model.config, n), full
    assert page.get_attribute("#model-map .map-node.on", "data-full") == "layers.2.attn.softmax"

    page.click("#model-map .map-node[data-full='layers.2.mlp.gate']")
    idle(page)
    assert page.is_visible("#heatmap") and page.is_hidden("#model-map")
    assert heatmap(page)["name"] == "layers.2.mlp.gate"
    page.evaluate("() => window.glass.tab('map')")
    assert page.get_attribute("#model-map .map-node.on", "data-full") == "layers.2.mlp.gate"
    page.close()


def test_a_name_the_registry_gains_appears_on_the_map_by_itself(browser, server):
    page = browser.new_page()

    def with_a_new_name(route):
        info = route.fetch().json()
        at = next(i for i, n in enumerate(info["names"]) if n["name"] == "attn.softmax")
        info["names"].insert(at + 1, {**info["names"][at], "name": "attn.sparsemax"})
        route.fulfill(json=info)
    page.route("**/api/info", with_a_new_name)
    page.goto(server.url)
    page.wait_for_function("() => window.glass && window.glass.ready === true")
    page.evaluate("() => window.glass.tab('map')")
    names = page.eval_on_selector_all("#model-map .map-node[data-name]", "els => els.map(e => e.dataset.name)")
    assert names[names.index("attn.softmax") + 1] == "attn.sparsemax"
    page.close()


def test_the_head_grid_shows_every_head_and_a_click_opens_it(browser, server, parts):
    model, tokenizer = parts[0], parts[1]
    L, H = model.config.n_layers, model.config.n_heads
    ids = _ids(parts)
    n = len(ids)
    page = opened(browser, server.url, "{name: 'attn.softmax', layer: 0, head: 0}")
    page.evaluate("() => window.glass.tab('heads')")
    idle(page)
    assert page.locator("#head-grid .thumb").count() == L * H
    grid = page.evaluate("() => ({v: Array.from(window.glass.grid.values), m: Array.from(window.glass.grid.masked),"
                         " k: window.glass.grid.size, block: window.glass.grid.block})")
    assert (grid["k"], grid["block"]) == (n, 1)                          # a short prompt: every cell
    ref = traced(model, ids)
    future = np.triu(np.ones((n, n), bool), 1)
    want = np.stack([ref.get("attn.softmax", layer=layer) for layer in range(L)])      # (L, H, n, n)
    np.testing.assert_array_equal(np.array(grid["v"]).reshape(L, H, n, n), np.where(future, 0, want))
    np.testing.assert_array_equal(np.array(grid["m"]).reshape(L, n, n), np.broadcast_to(future, (L, n, n)))

    thumb = page.locator("#head-grid .thumb[data-layer='1'][data-head='2']")
    thumb.hover()
    assert page.is_visible("#tooltip") and "layer 1, head 2" in page.inner_text("#tooltip")
    thumb.click()
    idle(page)
    h = page.evaluate("() => [window.glass.heatmap.name, window.glass.heatmap.head, window.glass.state.tab]")
    assert h == ["layers.1.attn.softmax", 2, "heatmap"]

    # The same grid for the gradient, on one symmetric scale.
    page.evaluate("() => window.glass.select({grad: true})")
    page.evaluate("() => window.glass.tab('heads')")
    idle(page)
    g = page.evaluate("() => ({v: Array.from(window.glass.grid.values), grad: window.glass.grid.grad,"
                      " s: window.glass.grid.scale})")
    logits = ref.get("logits")[-1]
    targets = np.full(n, -100)
    targets[-1] = int(np.argmax(logits))
    gref = traced(model, ids, targets=targets)
    want = np.stack([gref.grad("attn.softmax", layer=layer) for layer in range(L)])   # (L, H, n, n)
    assert g["grad"] is True and g["s"]["lo"] == -g["s"]["hi"]
    np.testing.assert_allclose(np.array(g["v"]).reshape(L, H, n, n), np.where(future, 0, want), rtol=1e-6, atol=1e-9)
    page.locator("#head-grid .thumb[data-layer='3'][data-head='0']").click()
    idle(page)
    assert page.evaluate("() => [window.glass.heatmap.name, window.glass.heatmap.head, window.glass.heatmap.grad]") == [
        "layers.3.attn.softmax", 0, True]
    page.close()


def test_the_top_bar_is_on_an_absolute_scale_so_it_shortens_as_the_temperature_rises(browser, server):
    page = opened(browser, server.url)

    def top_bar(T):
        page.fill("#temperature", str(T))
        page.dispatch_event("#temperature", "input")
        first = page.locator("#bars li.bar").first
        width = float(first.locator(".fill").evaluate("e => parseFloat(e.style.width)"))
        track = first.locator(".track").evaluate("e => e.getBoundingClientRect().width")
        fill = first.locator(".fill").evaluate("e => e.getBoundingClientRect().width")
        return width, float(first.get_attribute("data-prob")), fill / track

    w1, p1, f1 = top_bar(1)
    w3, p3, f3 = top_bar(3)
    assert w1 == pytest.approx(100 * p1, abs=0.01) and w3 == pytest.approx(100 * p3, abs=0.01)
    assert p3 < p1 and f3 < f1 - 0.01                                     # the drawn bar is shorter
    assert page.locator("#bars .cols").inner_text().split() == ["candidate", "p", "(track", "0", "…", "1)", "p", "sampled"]
    page.close()


def test_legend_and_help_name_the_same_scale_for_every_view(browser, server, parts):
    page = opened(browser, server.url)
    names = page.evaluate("() => window.glass.info.names.map(n => n.name)")
    checked = 0
    for name in names:
        for grad in (False, True):
            page.evaluate(f"() => window.glass.select({{name: {json.dumps(name)}, layer: 1, grad: {str(grad).lower()}}})")
            idle(page)
            if page.is_visible("#view-error"):
                continue
            legend = page.inner_text("#legend-note")
            help_ = page.inner_text("#howto-scale b")
            assert legend and legend == help_, (name, grad)
            assert not re.search(r"largest value|fixed 0|0 … max", page.inner_text("#howto-text").replace(help_, "")), name
            checked += 1
    assert checked >= len(names)
    for grad in ("false", "true"):                                          # the head grid too
        page.evaluate(f"() => window.glass.select({{name: 'attn.softmax', grad: {grad}}})")
        page.evaluate("() => window.glass.tab('heads')")
        idle(page)
        assert page.inner_text("#grid-legend-note") == page.inner_text("#grid-howto-scale b") != ""
        page.evaluate("() => window.glass.tab('heatmap')")
    page.close()


def test_row_labels_stay_in_sight_when_a_wide_heatmap_scrolls(browser, server):
    page = opened(browser, server.url, "{name: 'probs'}")
    wrap = page.locator("#heatmap-wrap")
    assert wrap.evaluate("e => e.scrollWidth > e.clientWidth")              # 1,024 columns: it scrolls
    wrap.evaluate("e => { e.scrollLeft = 700; }")
    at = page.evaluate("""() => { const w = document.getElementById('heatmap-wrap').getBoundingClientRect();
        const c = window.glass.heatmap.cellCenter(2, 0), h = document.getElementById('heatmap').getBoundingClientRect();
        const e = document.elementFromPoint(w.left + 30, h.top + c.y);
        return {id: e && e.id, left: document.getElementById('heatmap-rows').getBoundingClientRect().left - w.left}; }""")
    assert at["id"] == "heatmap-rows" and abs(at["left"]) <= 1
    # The strip holds the labels: it is not blank where row 2's label is drawn.
    ink = page.evaluate("""() => { const s = document.getElementById('heatmap-rows'), g = s.getContext('2d');
        const y = Math.round(window.glass.heatmap.cellCenter(2, 0).y * (window.devicePixelRatio || 1));
        const px = g.getImageData(0, y - 3, s.width, 6).data; let dark = 0;
        for (let i = 0; i < px.length; i += 4) if (px[i] < 120) dark++; return dark; }""")
    assert ink > 5
    page.close()


def test_hover_values_are_rounded_to_the_dtype(browser, server, parts):
    page = opened(browser, server.url, "{name: 'attn.scores', layer: 1, head: 0}")
    assert page.evaluate("() => window.glass.info.model.dtype") == "float32"
    h = heatmap(page)
    values = np.array(h["values"]).reshape(h["rows"], h["cols"])
    long_seen = False
    for i, j in [(1, 0), (2, 1), (3, 3), (3, 0)]:
        shown = hover(page, i, j)
        text = page.inner_text("#tooltip .big")
        want = np.float32(values[i, j])
        assert float(shown["value"]) == float(want)                        # the exact number stays in data-value
        assert np.float32(float(text)) == want                              # the shown one reads back as it
        digits = re.sub(r"e.*$|[-.]", "", text).lstrip("0")
        shortest = np.format_float_scientific(want, unique=True).split("e")[0].replace("-", "").replace(".", "")
        assert len(digits) == len(shortest.rstrip("0") or "0") <= 9, (text, shortest)
        long_seen |= len(repr(float(want)).replace("-", "").replace(".", "").lstrip("0")) > 9
        assert page.inner_text("#readout").endswith(text)
    assert long_seen                                                        # float64's repr would show more digits
    page.close()


def test_an_intervention_shows_before_after_and_difference_and_says_what_ablation_leaves(browser, server, parts):
    from glassllm.trace import ZeroAblate

    model = parts[0]
    ids = _ids(parts)
    n = len(ids)
    page = opened(browser, server.url, "{name: 'attn.softmax', layer: 0, head: 2}")
    page.evaluate("() => window.glass.intervene({kind: 'ablate', layer: 0, head: 2})")
    idle(page)
    note = page.inner_text("#iv-note")
    assert "its own pattern does not change" in note and "every later layer" in note
    assert page.is_visible("#compare") and page.evaluate("() => window.glass.compare.own") is True
    assert "does not change" in page.inner_text("#compare-note")
    assert page.evaluate("() => window.glass.compare.maxAbs") == 0

    page.evaluate("() => window.glass.select({layer: 1, head: 2})")
    idle(page)
    c = page.evaluate("() => { const c = window.glass.compare; return {b: Array.from(c.before), a: Array.from(c.after),"
                      " d: Array.from(c.diff), big: c.maxAbs}; }")
    before = traced(model, ids).get("attn.softmax", layer=1, head=2)
    after = traced(model, ids, interventions=[ZeroAblate(0, 2)]).get("attn.softmax", layer=1, head=2)
    np.testing.assert_array_equal(np.array(c["b"]).reshape(n, n), before)
    np.testing.assert_array_equal(np.array(c["a"]).reshape(n, n), after)
    np.testing.assert_allclose(np.array(c["d"]).reshape(n, n), after.astype(np.float64) - before, rtol=0, atol=0)
    assert c["big"] == np.abs(after.astype(np.float64) - before).max() > 0
    boxes = page.evaluate("""() => ['compare-before', 'compare-after', 'compare-diff'].map(id =>
        document.getElementById(id).getBoundingClientRect().top)""")
    assert max(boxes) - min(boxes) < 2                                      # side by side
    page.evaluate("() => window.glass.intervene(null)")
    idle(page)
    assert page.is_hidden("#compare")
    page.close()


# ----------------------------------------------------------------------------
# The training timeline
# ----------------------------------------------------------------------------

def _training_page(browser, inspector_, tab="training"):
    from glassllm.inspector import create_app
    from glassllm.inspector.server import Server

    server_ = Server(create_app(inspector_, prompt="Once upon a time", tab=tab), "127.0.0.1", 0).start()
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server_.url)
    page.wait_for_function("() => window.glass && window.glass.ready === true", timeout=60_000)
    idle(page)
    return server_, page, errors


def test_the_timeline_slider_changes_the_shown_pattern(browser, tmp_path):
    from tests.test_inspector_timeline import tiny_run

    from glassllm.inspector import Inspector
    from glassllm.commands.inspect import load_inspected

    tiny_run(tmp_path)
    model, tokenizer, meta, timeline = load_inspected(None, str(tmp_path / "run"))
    server_, page, errors = _training_page(browser, Inspector(model, tokenizer, meta=meta, timeline=timeline))
    try:
        assert page.is_visible("#panel-training") and page.is_visible("#tl-slider")
        S, L, H, n = timeline.attn.shape[:4]
        shown = {}
        for s in (0, S // 2, S - 1):
            page.fill("#tl-slider", str(s))
            page.dispatch_event("#tl-slider", "input")
            t = page.evaluate("() => window.glass.timeline")
            assert t["index"] == s and t["step"] == timeline.steps[s]
            layer, head = t["selected"]["layer"], t["selected"]["head"]
            np.testing.assert_array_equal(np.array(t["pattern"], dtype=np.float32).reshape(n, n),
                                          timeline.attn[s, layer, head])                   # the file's numbers
            shown[s] = page.evaluate("() => document.getElementById('tl-head').toDataURL()")
            assert f"step {timeline.steps[s]:,}" in page.inner_text("#tl-row")
        assert shown[0] != shown[S - 1]                                        # the drawn pattern changed
        np.testing.assert_array_equal(np.array(t["scores"], dtype=np.float32).reshape(S, L, H), timeline.induction)
        # A thumbnail picks the head shown large.
        page.click("#tl-grid .thumb[data-layer='1'][data-head='3']")
        assert page.evaluate("() => window.glass.timeline.selected") == {"layer": 1, "head": 3}
        assert page.inner_text("#tl-legend-note") == page.inner_text("#tl-howto-scale b") != ""
        assert errors == []
    finally:
        page.close()
        server_.stop()


def test_the_bundled_history_shows_the_induction_head_appear(browser, parts):
    from glassllm.checkpoint import bundled_model_path
    from glassllm.inspector import Inspector
    from glassllm.timeline import load_timeline, timeline_path_for

    path = timeline_path_for(bundled_model_path())
    if parts[2] != "bundled" or not path.is_file():
        pytest.skip(f"the bundled model's timeline {path.name} is not installed")
    timeline = load_timeline(path)
    server_, page, errors = _training_page(browser, Inspector(parts[0], parts[1], meta=parts[3], timeline=timeline))
    try:
        best = []
        for s in range(len(timeline.steps)):
            page.fill("#tl-slider", str(s))
            page.dispatch_event("#tl-slider", "input")
            best.append(float(page.get_attribute("#tl-best", "data-score")))
        np.testing.assert_allclose(best, timeline.induction.reshape(len(best), -1).max(axis=1), rtol=1e-6)
        assert best[0] < 0.2 and best[-1] > 0.5                                 # from chance to an induction head
        assert errors == []
    finally:
        page.close()
        server_.stop()


def test_the_full_distribution_says_what_its_floor_is(browser, server):
    page = opened(browser, server.url)
    page.click("#show-all")
    probs = np.array(page.evaluate("() => Array.from(window.glass.next.probs)"))
    floor = int(np.sum(probs <= 2 * probs.min()))
    assert int(page.get_attribute("#all-floor", "data-count")) == floor
    text = page.inner_text("#all-floor")
    assert ("flat floor at the right" in text) == (floor >= 0.02 * len(probs)) and "floor" in text
    page.close()


@pytest.mark.parametrize("status", [503, 429])
def test_a_busy_server_shows_busy_retrying_and_the_page_asks_again(browser, server, status):
    """The server's 503 (pool full) or 429 (rate): the page says so, waits Retry-After, and gets its view."""
    page = opened(browser, server.url)
    answered, notes = [], []

    def busy_once(route):
        if not answered:
            answered.append(status)
            route.fulfill(status=status, headers={"Retry-After": "1"}, json={"error": "the inspector is busy"})
        else:
            answered.append(200)
            route.continue_()
    page.route("**/api/snapshot", busy_once)
    page.evaluate("() => { window.glass.select({name: 'mlp.act', layer: 1}); }")      # not awaited
    page.wait_for_function("() => { const b = document.getElementById('busy-line'); return b && !b.hidden; }")
    notes.append(page.inner_text("#busy-line"))
    idle(page)
    assert answered[:2] == [status, 200], answered
    assert notes == ["busy, retrying in 1 s…"]
    assert page.is_hidden("#busy-line")
    assert heatmap(page)["name"] == "layers.1.mlp.act"
    page.close()
