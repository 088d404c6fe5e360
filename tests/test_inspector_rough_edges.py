"""The inspector as a new learner meets it, in Chromium: what looks clickable acts, what is shown fits.

One live server and one browser for the module (the fixtures of test_inspector_browser); each test opens a
page, sets the window it needs and checks one thing a learner tripped over: token chips pick a position, a
picked candidate is marked, the first heatmap follows its frame's width, the heatmap and an intervention
with its effect fit one 1400 x 900 screen, nothing overflows at 800 px, a decoding step's reading notes fit
its single row, and a notebook view lists only what it holds.
"""

from __future__ import annotations

import pytest
from tests.test_inspector_browser import (PROMPT, browser, heatmap, idle, inspector, opened, parts,  # noqa: F401
                                    server)

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def page(browser, server):                                              # noqa: F811
    page = opened(browser, server.url)
    page.evaluate(f"() => window.glass.run({PROMPT!r})")
    idle(page)
    yield page
    page.close()


def _select(page, view: str):
    page.evaluate(f"() => window.glass.select({view})")
    idle(page)


def test_a_token_chip_picks_its_query_row_and_key_column(page):
    page.set_viewport_size({"width": 1440, "height": 1000})
    _select(page, "{name: 'attn.softmax', layer: 1, head: 2}")
    assert heatmap(page)["name"] == "layers.1.attn.softmax"
    page.click("#tokens .tok[data-pos='5']")
    idle(page)
    got = page.evaluate("() => [window.glass.heatmap.queryRow, window.glass.heatmap.queryCol]")
    assert got == [5, 5]
    assert page.get_attribute("#tokens .tok[data-pos='5']", "aria-pressed") == "true"
    assert "5" in page.inner_text("#readout")
    # A vector view: the chip picks the position's row; its columns are features, not positions.
    _select(page, "{name: 'resid_post', layer: 0}")
    assert page.evaluate("() => [window.glass.heatmap.queryRow, window.glass.heatmap.queryCol]") == [5, -1]
    page.click("#tokens .tok[data-pos='5']")                        # a second click lets go
    idle(page)
    assert page.evaluate("() => window.glass.heatmap.queryRow") == -1


def test_a_clicked_candidate_is_marked_in_the_list(page):
    _select(page, "{name: 'attn.softmax', layer: 0, head: 0, grad: false}")
    first = page.locator("#bars li.bar.clickable").nth(2)
    token = first.get_attribute("data-id")
    first.click()
    idle(page)
    marked = page.locator("#bars li.bar.picked")
    assert marked.count() == 1 and marked.get_attribute("data-id") == token
    assert marked.get_attribute("aria-pressed") == "true"
    _select(page, "{grad: false}")


def test_the_heatmap_and_an_intervention_with_its_effect_fit_one_1400_by_900_screen(page):
    page.set_viewport_size({"width": 1400, "height": 900})
    page.evaluate("() => window.scrollTo(0, 0)")
    _select(page, "{name: 'attn.softmax', layer: 2, head: 3, grad: false}")
    page.evaluate("() => window.glass.intervene({kind: 'ablate', layer: 2, head: 3})")
    idle(page)
    page.evaluate("() => window.scrollTo(0, 0)")
    boxes = page.evaluate("""() => Object.fromEntries(["heatmap", "iv-layer", "iv-bars", "iv-summary"].map((id) => {
        const r = document.getElementById(id).getBoundingClientRect(); return [id, [r.top, r.bottom]]; }))""")
    for name, (top, bottom) in boxes.items():
        assert 0 <= top and bottom <= 900, (name, top, bottom)
    assert page.locator("#iv-bars li.bar").count() >= 6
    page.evaluate("() => window.glass.intervene(null)")
    idle(page)
    page.set_viewport_size({"width": 1440, "height": 1000})


def test_at_800_px_the_lens_table_and_attribution_bars_stay_in_their_cards(page):
    page.set_viewport_size({"width": 800, "height": 900})
    idle(page)
    over = page.evaluate("""() => ["logit lens", "direct logit attribution"].map((label) => {
        const card = document.querySelector(`section[aria-label="${label}"]`).getBoundingClientRect();
        const inside = [...document.querySelectorAll(`section[aria-label="${label}"] *`)]
          .filter((e) => !e.closest(".lens-wrap") || e.classList.contains("lens-wrap"))
          .map((e) => e.getBoundingClientRect()).filter((r) => r.width > 0);
        return {label, card: [card.left, card.right], worst: Math.max(...inside.map((r) => r.right)),
                page: document.documentElement.scrollWidth};
    })""")
    for o in over:
        assert o["worst"] <= o["card"][1] + 0.5, o
        assert o["page"] <= 800, o
    page.set_viewport_size({"width": 1440, "height": 1000})


def test_a_decoding_steps_reading_notes_fit_its_single_row(page):
    _select(page, "{name: 'attn.softmax', layer: 2, head: 3, grad: false}")
    assert "hatched cells are future keys" in page.inner_text("#howto-text")
    page.click("#step")
    idle(page)
    h = heatmap(page)
    assert h["rows"] == 1 and h["start"] == h["m"] - 1
    text = page.inner_text("#howto-text")
    assert "hatched cells are future keys" not in text and "Rows go down" not in text
    assert "nothing is masked" in text and f"position {h['start']}" in text
    page.click("#reset")
    idle(page)


# The canvas's drawn width and its cells' width, read from the page as any version of it draws them.
GEOMETRY = """() => { const h = window.glass.heatmap;
    return {w: parseFloat(document.getElementById("heatmap").style.width),
            cw: h.cellCenter(0, 1).x - h.cellCenter(0, 0).x}; }"""


def test_the_first_heatmap_follows_a_frame_that_gets_its_width_after_the_first_draw(browser, server):  # noqa: F811
    """A notebook's output frame can be laid out narrow when the page first draws and widen later while the
    window keeps its size: the heatmap is drawn again for the new width (token labels, not numbers)."""
    page = browser.new_page()
    # Narrow from the first draw on, as an output frame not yet laid out; the style goes once the page is ready.
    page.add_init_script("""(() => { const sheet = new CSSStyleSheet(); sheet.replaceSync("main { width: 330px; }");
        document.adoptedStyleSheets = [sheet]; window.__narrow = sheet; })()""")
    page.goto(server.url)
    page.wait_for_function("() => window.glass && window.glass.ready === true")
    page.evaluate(f"() => window.glass.run({PROMPT!r})")
    idle(page)
    narrow = page.evaluate(GEOMETRY)
    assert narrow["cw"] < 9                                              # too narrow for token labels
    page.evaluate("() => { document.adoptedStyleSheets = []; }")
    page.wait_for_timeout(1000)
    wide = page.evaluate(GEOMETRY)
    assert wide["cw"] >= 9, wide
    assert wide["w"] > narrow["w"]
    page.close()


def test_the_notebook_view_lists_only_the_snapshots_and_interventions_it_holds(browser, tmp_path):  # noqa: F811
    import glassllm
    from glassllm.checkpoint import bundled_model_path

    if not bundled_model_path().exists():
        pytest.skip("needs the bundled model")
    view = glassllm.show("Once upon a time", steps=0)
    path = tmp_path / "inline.html"
    view.save(path)
    page = browser.new_page()
    page.goto(path.as_uri())
    page.wait_for_function("() => window.glass && window.glass.ready === true", timeout=60_000)
    idle(page)
    options = page.eval_on_selector_all("#snapshot option", "els => els.map((e) => e.value)")
    held = page.evaluate("() => window.glass.info.offline.held")
    assert options == held and len(held) < len(page.evaluate("() => window.glass.info.names"))
    note = page.inner_text("#offline-note")
    assert "names=None" in note and page.is_visible("#offline-note")
    radios = page.eval_on_selector_all("input[name=iv]", "els => els.map((e) => [e.value, e.disabled])")
    assert all(disabled == (value != "none") for value, disabled in radios)
    assert "interventions=True" in page.inner_text("#iv-note")
    assert page.locator("#model-map button[data-absent='1']").count() == len(page.evaluate(
        "() => window.glass.info.names")) - len(held)
    # The equation and the code line are in the notebook view too.
    assert page.get_attribute("#explain-eq", "data-text") == "A = softmaxⱼ(S with S[M] = −∞)"
    page.close()


# ----------------------------------------------------------------------------
# Step through one forward pass
# ----------------------------------------------------------------------------

def walk_layer(page, model, tokenizer, layer: int, position: int = 5, prompt: str = PROMPT) -> None:
    """Walk with the → key from the first snapshot to the end of ``layer``: the names come in the registry's
    forward order, each shows ``position``'s row of the tracer's array, its equation and code line, and the
    model map marks it."""
    import numpy as np
    from tests.test_inspector_browser import traced

    from glassllm.trace.explain import explain

    ids = tokenizer.encode(prompt, allowed_special="all")
    ref = traced(model, ids)
    order = [k for k in model.snapshot_axes() if not k.startswith("layers.") or int(k.split(".")[1]) <= layer]
    order = order[:order.index(f"layers.{layer}.resid_post") + 1]
    page.click("#tabs button[data-tab=walk]")
    page.select_option("#walk-pos", str(position))
    page.evaluate("() => window.glass.walkTo(0)")
    page.wait_for_function("() => window.glass.walk && window.glass.walk.index === 0 && window.glass.walk.row")
    assert page.locator("#walk-map #model-map").count() == 1
    seen = []
    for k in range(len(order)):
        if k:
            if k == 1:
                page.focus("#walk-next")                      # where a click on the tab leaves the focus
            page.keyboard.press("ArrowRight")
            page.wait_for_function(f"() => window.glass.walk.index === {k} && window.glass.walk.row")
        w = page.evaluate("() => window.glass.walk")
        seen.append(w["name"])
        assert w["position"] == position
        want = ref.get(w["name"], head=w["head"])
        want = want[:, None] if want.ndim == 1 else want
        np.testing.assert_array_equal(np.array(w["row"], dtype=np.float64),
                                      want[w["rowIndex"]].astype(np.float64), err_msg=w["name"])
        assert w["rowIndex"] == position                      # no cache: rows are positions 0 .. n-1
        info = explain(w["name"])
        assert page.get_attribute("#walk-eq", "data-text") == info["equation"]["text"]
        assert page.inner_text("#walk-where") == f"{info['path']}:{info['line']}"
        assert page.get_attribute("#model-map button.walk-on", "data-name") == w["local"]
    assert seen == order


def test_the_step_through_walks_a_layer_in_forward_order_live(page, parts):                 # noqa: F811
    model, tokenizer, _, _ = parts
    page.set_viewport_size({"width": 1440, "height": 1000})
    walk_layer(page, model, tokenizer, layer=1)
    # ← goes back; Play advances at a readable pace and Pause stops it.
    at = page.evaluate("() => window.glass.walk.index")
    page.keyboard.press("ArrowLeft")
    page.wait_for_function(f"() => window.glass.walk.index === {at - 1} && window.glass.walk.row")
    at -= 1
    page.click("#walk-play")
    page.wait_for_function(f"() => window.glass.walk.index >= {at + 1}", timeout=10_000)
    page.click("#walk-play")
    assert page.get_attribute("#walk-play", "aria-pressed") == "false"
    stopped = page.evaluate("() => window.glass.walk.index")
    page.wait_for_timeout(2000)
    assert page.evaluate("() => window.glass.walk.index") == stopped
    page.evaluate("() => window.glass.tab('heatmap')")
    idle(page)
    assert page.locator("#panel-map #model-map").count() == 1          # the map is back in its own tab


def test_the_step_through_works_in_the_offline_export(browser, inspector, parts, tmp_path):  # noqa: F811
    from glassllm.inspector import export_html

    model, tokenizer, _, _ = parts
    path = tmp_path / "walk.html"
    short = "Once upon a time there was a dog"                          # a smaller export, the same page
    export_html(inspector, short, path, steps=0)
    page = browser.new_page()
    page.goto(path.as_uri())
    page.wait_for_function("() => window.glass && window.glass.ready === true", timeout=60_000)
    idle(page)
    walk_layer(page, model, tokenizer, layer=0, position=3, prompt=short)
    # Saving works offline too (the page's policy forbids requests, not downloads).
    page.evaluate("() => window.glass.tab('heatmap')")
    idle(page)
    name, data = _download(page, ".save[data-view=heatmap] button[data-format=csv]")
    assert name.endswith(".csv") and data.decode("utf-8").startswith(f"# prompt: {short}\n")
    page.close()


# ----------------------------------------------------------------------------
# Save what you see
# ----------------------------------------------------------------------------

def _download(page, selector: str) -> tuple[str, bytes]:
    with page.expect_download() as d:
        page.click(selector)
    download = d.value
    return download.suggested_filename, open(download.path(), "rb").read()


def test_every_view_saves_as_png_and_its_numbers_as_csv_and_json(page, parts):                 # noqa: F811
    import csv
    import io
    import json

    import numpy as np
    from tests.test_inspector_browser import softmax64, traced

    model, tokenizer, _, _ = parts
    page.set_viewport_size({"width": 1440, "height": 1000})
    page.evaluate("() => window.glass.tab('heatmap')")
    _select(page, "{name: 'attn.softmax', layer: 2, head: 3, grad: false}")
    ids = tokenizer.encode(PROMPT, allowed_special="all")
    n = len(ids)
    ref = traced(model, ids)
    want = ref.get("attn.softmax", layer=2, head=3)

    name, data = _download(page, ".save[data-view=heatmap] button[data-format=csv]")
    assert name == "glassllm-layers.2.attn.softmax-head3.csv"
    text = data.decode("utf-8")
    about = [line for line in text.splitlines() if line.startswith("# ")]
    assert f"# prompt: {PROMPT}" in about and any(line.startswith("# model: 4 layers") for line in about)
    assert "# snapshot: layers.2.attn.softmax" in about and "# head: 3" in about
    table = list(csv.reader(io.StringIO("\n".join(line for line in text.splitlines() if not line.startswith("# ")))))
    assert len(table) == n + 1 and len(table[0]) == n + 1
    pieces = tokenizer.pieces(ids)
    assert table[0][1:] == [f"{j} {p}" for j, p in enumerate(pieces)]
    got = np.array([[float(v) if v else np.nan for v in row[1:]] for row in table[1:]])
    future = np.triu(np.ones((n, n), bool), 1)
    assert np.isnan(got[future]).all()                                   # masked: left empty
    np.testing.assert_array_equal(got[~future].astype(np.float32), want[~future])   # the trace's numbers, exactly

    name, data = _download(page, ".save[data-view=heatmap] button[data-format=png]")
    assert name.endswith(".png") and data[:8] == b"\x89PNG\r\n\x1a\n"
    width = int.from_bytes(data[16:20], "big")
    assert width == page.evaluate("() => document.getElementById('heatmap').width")

    name, data = _download(page, ".save[data-view=next] button[data-format=json]")
    doc = json.loads(data)
    assert doc["prompt"] == PROMPT and doc["columns"] == ["id", "piece", "logit", "p", "sampled"]
    p = softmax64(ref.get("logits")[-1], doc["temperature"])
    for token, piece, _, prob, _ in doc["rows"]:
        assert piece == tokenizer.piece(token) and prob == pytest.approx(p[token], rel=1e-12)

    for view in ("lens", "attribution"):
        name, data = _download(page, f".save[data-view={view}] button[data-format=csv]")
        assert data.decode("utf-8").startswith(f"# prompt: {PROMPT}\n"), view
        name, data = _download(page, f".save[data-view={view}] button[data-format=png]")
        assert data[:8] == b"\x89PNG\r\n\x1a\n", view
    attribution = page.evaluate("() => window.glass.attribution")
    name, data = _download(page, ".save[data-view=attribution] button[data-format=json]")
    assert json.loads(data)["rows"] == [[label, v] for label, v in zip(attribution["labels"], attribution["values"])]
    # The head grid: every layer's and head's weights, as drawn.
    page.evaluate("() => window.glass.tab('heads')")
    idle(page)
    name, data = _download(page, ".save[data-view=grid] button[data-format=json]")
    doc = json.loads(data)
    L, H = model.config.n_layers, model.config.n_heads
    assert doc["shape"] == [L, H, n, n] and doc["prompt"] == PROMPT
    grid = np.array([row[1:] for row in doc["rows"]], dtype=np.float64).reshape(L, H, n, n)
    for layer in range(L):
        np.testing.assert_array_equal(grid[layer].astype(np.float32), ref.get("attn.softmax", layer=layer))
    name, data = _download(page, ".save[data-view=grid] button[data-format=png]")
    assert data[:8] == b"\x89PNG\r\n\x1a\n"
    page.evaluate("() => window.glass.tab('heatmap')")
    idle(page)
