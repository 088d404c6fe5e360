"""The inspector's page in a real browser: Debian's Chromium, driven by Playwright.

The same walk-through runs twice: against the live server (uvicorn in a
thread on a free loopback port) and on the exported HTML file opened from
disk with every non-file request aborted. It types a prompt (live only), picks
layer 2, head 3 and ``attn.softmax`` with the page's own controls, and checks
the numbers the page shows against the tracer's (:mod:`glassllm.trace`):

- the heatmap is n x m and every cell equals the tracer's value, bit for bit;
  hovering a cell shows that exact value;
- after moving the temperature slider, the displayed probabilities equal
  softmax(logits / T) computed here in float64, and the survivors of top-k /
  top-p equal :mod:`glassllm.sampling`'s;
- two decoding steps grow m by one each, with the tracer's numbers;
- ablating a head changes the next-token distribution, to the tracer's numbers.

It saves screenshots under ``test-artifacts/`` and, live, measures a
256-token prompt: render and switch times are *reported*
(``test-artifacts/inspector-timings.json``), never asserted -- speed is not a
unit test. Without Chromium or Playwright the tests skip, unless
``GLASSLLM_REQUIRE_BROWSER=1`` (set by ``.ci/run``) makes that a failure.
"""

from __future__ import annotations

import json
import os
import statistics
import tempfile
from pathlib import Path

import numpy as np
import pytest

CHROMIUM = os.environ.get("GLASSLLM_CHROMIUM", "/usr/bin/chromium")   # Debian's package
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update"]
ARTIFACTS = Path(__file__).resolve().parents[1] / "test-artifacts"
PROMPT = "Once upon a time, there was a little dog named Max. He liked to run and play with his red ball."

pytestmark = pytest.mark.browser


def _unavailable(reason: str):
    if os.environ.get("GLASSLLM_REQUIRE_BROWSER") == "1":
        pytest.fail(f"GLASSLLM_REQUIRE_BROWSER=1 but the browser tests cannot run: {reason}")
    pytest.skip(f"needs a browser: {reason}")


@pytest.fixture(scope="module")
def browser():
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("Playwright's Python package is not installed (pip install playwright)")
    if not os.path.exists(CHROMIUM):
        _unavailable(f"Chromium is not installed at {CHROMIUM} (Debian: apt-get install chromium)")
    with tempfile.TemporaryDirectory(prefix="glassllm-chromium-") as profile, sync_playwright() as p:
        try:
            context = p.chromium.launch_persistent_context(
                profile, executable_path=CHROMIUM, headless=True, args=ARGS,
                viewport={"width": 1440, "height": 1000}, device_scale_factor=1,
                # Playwright's waiting helpers evaluate strings, which the page's CSP forbids.
                bypass_csp=True)
        except Exception as e:  # Playwright raises its own error type
            _unavailable(f"Chromium at {CHROMIUM} does not start: {str(e).splitlines()[0]}")
        yield context
        context.close()


@pytest.fixture(scope="module")
def parts():
    """The bundled model when it is installed (the screenshot shows it), else one made here."""
    from glassllm.checkpoint import bundled_model_path, load_model

    if bundled_model_path().exists():
        model, tokenizer, meta = load_model(bundled_model_path())
        return model, tokenizer, "bundled", meta
    from tests.test_inspector_api import make_model_and_tokenizer

    model, tokenizer = make_model_and_tokenizer(np.float32)
    return model, tokenizer, "random", {}


@pytest.fixture(scope="module")
def inspector(parts):
    from glassllm.inspector import Inspector, Limits

    return Inspector(parts[0], parts[1], Limits(max_prompt_tokens=256, max_new_tokens=16), meta=parts[3])


@pytest.fixture(scope="module")
def server(inspector):
    from glassllm.inspector import create_app
    from glassllm.inspector.server import Server

    s = Server(create_app(inspector, prompt="Once upon a time"), "127.0.0.1", 0).start()
    yield s
    s.stop()


# ----------------------------------------------------------------------------
# References from the tracer
# ----------------------------------------------------------------------------

def softmax64(z, T):
    z = np.asarray(z, dtype=np.float64)
    e = np.exp((z - z.max()) / T)
    return e / e.sum()


def traced(model, ids, **kw):
    from glassllm.trace import trace

    return trace(model, np.array(ids), **kw)


def decoded_steps(model, tokenizer, ids, steps):
    """The tracer's record of greedy decoding with the KV cache."""
    from glassllm.generate import generate
    from glassllm.trace import Tracer

    with Tracer(model) as tracer:  # every name, as the inspector records: the same code path, the same bits
        list(generate(model, tokenizer, ids, max_new_tokens=steps + 1, temperature=0, fast=False))
    return tracer.trace


# ----------------------------------------------------------------------------
# The walk-through
# ----------------------------------------------------------------------------

def idle(page):
    page.evaluate("() => window.glass.idle()")


def token_chips(page) -> list[str]:
    """The prompt's token chips as the page shows them (spaces drawn as ␣)."""
    return page.locator("#tokens .tok b").all_inner_texts()


def pick(page, layer: int, name: str, head: int) -> None:
    """Choose a view with the page's own controls (layer button, snapshot menu, head button); wait for it."""
    page.click(f"#layers button[data-layer='{layer}']")
    page.select_option("#snapshot", name)
    page.click(f"#heads button[data-head='{head}']")
    idle(page)


def heatmap(page) -> dict:
    return page.evaluate("""() => { const h = window.glass.heatmap;
        return {name: h.name, rows: h.rows, cols: h.cols, n: h.n, m: h.m, start: h.start,
                values: Array.from(h.values), rowSums: h.rowSums}; }""")


def hover(page, i, j) -> dict:
    at = page.evaluate(f"() => window.glass.heatmap.cellCenter({i}, {j})")
    page.locator("#heatmap").hover(position=at)   # scrolls the canvas into view first
    tip = page.locator("#tooltip")
    assert tip.is_visible()
    return {"value": tip.get_attribute("data-value"), "row": int(tip.get_attribute("data-row")),
            "col": int(tip.get_attribute("data-col")), "text": tip.inner_text()}


def check_explained(page, local: str) -> None:
    """Beside the heatmap: the snapshot's equation and the statement of nn.py that recorded it (found from the
    code by glassllm.trace.explain), with its neighbours; the model-map link opens the map on it."""
    from glassllm.trace.explain import explain

    want = explain(local)
    assert page.get_attribute("#explain-eq", "data-text") == want["equation"]["text"]
    assert page.inner_text("#explain-eq") == want["equation"]["text"].replace("_", "")   # W_K typeset as W<sub>K</sub>
    assert page.get_attribute("#explain-eq", "data-latex") == want["equation"]["latex"]
    assert page.inner_text("#explain-where") == f"{want['path']}:{want['line']}"
    assert page.inner_text("#explain-fn") == want["function"]
    site = page.inner_text("#explain-code mark").splitlines()
    assert [line.split(None, 1)[1].rstrip() for line in site] == [s.rstrip() for s in want["code"].splitlines()]
    assert int(site[0].split()[0]) == want["first"]
    shown = page.inner_text("#explain-code").splitlines()
    assert int(shown[0].split()[0]) < want["first"] and int(shown[-1].split()[0]) > want["last"]  # its neighbours


def walk_through(page, model, tokenizer, typed: bool) -> None:
    from glassllm.sampling import sampling_distribution
    from glassllm.trace import ZeroAblate

    page.wait_for_function("() => window.glass && window.glass.ready === true", timeout=60_000)
    if typed:
        page.fill("#prompt", PROMPT)
        page.press("#prompt", "Enter")
        idle(page)
    ids = tokenizer.encode(PROMPT, allowed_special="all")
    n = len(ids)
    assert token_chips(page) == [p.replace(" ", "␣") for p in tokenizer.pieces(ids)]

    # Pick layer 2, attn.softmax, head 3 with the page's controls.
    pick(page, 2, "attn.softmax", 3)
    assert page.locator("#heads button").count() == 4
    h = heatmap(page)
    ref = traced(model, ids)
    want = ref.get("attn.softmax", layer=2, head=3, step=0).astype(np.float64)        # (n, m)
    assert h["name"] == "layers.2.attn.softmax" and (h["rows"], h["cols"]) == (n, n) == want.shape
    assert page.get_attribute("#heatmap", "data-m") == str(n)
    np.testing.assert_array_equal(np.array(h["values"]).reshape(n, n), want)          # bit for bit
    np.testing.assert_allclose(h["rowSums"], 1.0, rtol=1e-5)
    for i, j in [(n - 1, 0), (n // 2, n // 3), (n - 1, n - 1), (0, n - 1)]:
        shown = hover(page, i, j)
        assert (shown["row"], shown["col"]) == (i, j)
        assert float(shown["value"]) == want[i, j]
        assert ("masked" in shown["text"]) == (j > i)
    howto = page.locator("#panel-heatmap details.howto").inner_text()
    assert all(w in howto for w in ("Axes first", "Masks next", "row sums", "ablate the head"))
    check_explained(page, "attn.softmax")
    # Projected keys have two heads; attention weights four.
    page.select_option("#snapshot", "attn.k")
    idle(page)
    assert page.locator("#heads button").count() == 2
    check_explained(page, "attn.k")                          # the equation and the code line follow the view
    assert page.evaluate("() => window.glass.heatmap.head") == 1      # query head 3 reads K/V head 1
    page.select_option("#snapshot", "attn.softmax")
    idle(page)
    assert page.evaluate("() => window.glass.heatmap.head") == 3

    # Temperature 0.5 by keyboard (50 steps of 0.01 down), then top-k 10 and top-p 0.8.
    logits = ref.get("logits", step=0)[-1].astype(np.float64)                        # (V,)
    page.focus("#temperature")
    for _ in range(50):
        page.keyboard.press("ArrowLeft")
    assert page.input_value("#temperature") == "0.5"
    probs = np.array(page.evaluate("() => Array.from(window.glass.next.probs)"))
    np.testing.assert_allclose(probs, softmax64(logits, 0.5), rtol=1e-12, atol=1e-300)
    bars = page.eval_on_selector_all("#bars li.bar", "els => els.map(e => [Number(e.dataset.id), e.dataset.prob])")
    assert len(bars) == 12
    for token_id, shown in bars:
        assert float(shown) == pytest.approx(softmax64(logits, 0.5)[token_id], rel=1e-12)
    page.focus("#topk")
    for _ in range(10):
        page.keyboard.press("ArrowRight")
    page.focus("#topp")
    for _ in range(20):
        page.keyboard.press("ArrowLeft")
    nxt = page.evaluate("() => ({s: window.glass.next.survivors, q: Array.from(window.glass.next.sampled),"
                        " k: window.glass.next.topK, p: window.glass.next.topP})")
    assert (nxt["k"], nxt["p"]) == (10, 0.8)
    dist = sampling_distribution(logits, 0.5, 10, 0.8)
    assert sorted(nxt["s"]) == np.flatnonzero(dist > 0).tolist()
    np.testing.assert_allclose(nxt["q"], dist, rtol=1e-12, atol=1e-300)

    # Two decoding steps: one new query against one more key each time.
    steps = decoded_steps(model, tokenizer, ids, 2)
    for s in (1, 2):
        page.click("#step")
        idle(page)
        h = heatmap(page)
        assert (h["rows"], h["n"], h["m"], h["start"]) == (1, 1, n + s, n + s - 1)
        assert page.get_attribute("#heatmap", "data-m") == str(n + s)
        assert page.get_attribute("#step-line", "data-m") == str(n + s)
        want = steps.get("attn.softmax", layer=2, head=3, step=s).astype(np.float64)   # (1, m)
        np.testing.assert_array_equal(np.array(h["values"]).reshape(want.shape), want)
        shown = hover(page, 0, n + s - 1)
        assert float(shown["value"]) == want[0, -1]
        assert not page.locator("#legend-cache").is_hidden()
    page.click("#reset")
    idle(page)
    assert heatmap(page)["m"] == n

    # Ablate head 3 of layer 2: the distribution moves, to the tracer's numbers.
    page.check("input[name=iv][value=ablate]")
    page.select_option("#iv-layer", "2")
    page.select_option("#iv-head", "3")
    idle(page)
    got = page.evaluate("() => ({b: Array.from(window.glass.next.before), a: Array.from(window.glass.next.after)})")
    after = traced(model, ids, interventions=[ZeroAblate(2, 3)]).get("logits", step=0)[-1]
    np.testing.assert_allclose(got["b"], softmax64(logits, 0.5), rtol=1e-12, atol=1e-300)
    np.testing.assert_allclose(got["a"], softmax64(after, 0.5), rtol=1e-12, atol=1e-300)
    assert np.abs(np.array(got["a"]) - np.array(got["b"])).max() > 1e-6
    assert float(page.get_attribute("#iv-summary", "data-maxdiff")) > 1e-6
    assert page.locator("#iv-bars li.bar[data-id]").count() >= 6

    # Back to a clean state for the screenshot: T = 1, filters off, the head's weights hovered.
    page.focus("#temperature")
    for _ in range(50):
        page.keyboard.press("ArrowRight")
    page.focus("#topk")
    page.keyboard.press("Home")
    page.focus("#topp")
    page.keyboard.press("End")
    page.evaluate("() => document.activeElement.blur()")
    hover(page, n - 6, n // 3)


def test_a_missing_browser_skips_unless_ci_requires_it(monkeypatch):
    monkeypatch.delenv("GLASSLLM_REQUIRE_BROWSER", raising=False)
    with pytest.raises(pytest.skip.Exception, match="Chromium is not installed"):
        _unavailable("Chromium is not installed at /nowhere")
    monkeypatch.setenv("GLASSLLM_REQUIRE_BROWSER", "1")
    with pytest.raises(pytest.fail.Exception, match="GLASSLLM_REQUIRE_BROWSER=1 but"):
        _unavailable("Chromium is not installed at /nowhere")


def test_live_server(browser, server, parts):
    model, tokenizer, kind, _ = parts
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url)
    walk_through(page, model, tokenizer, typed=True)
    assert errors == []
    # The header says which path the layers took (the server's answer, kernels.summary of the trace's paths).
    assert page.text_content("#mode-line") == "live: local server · layer paths: every layer ran its reference code"
    # Canvas, not DOM cells: the whole page stays small.
    assert page.evaluate("() => document.getElementsByTagName('*').length") < 1500
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "inspector.png"), full_page=True)

    # A 256-token prompt: measured and reported, not asserted.
    words = "once upon a time there was the little dog ran and cat sat".split()
    text, k = "", 0
    while len(tokenizer.encode(text + " " + words[k % len(words)], allowed_special="all")) <= 256:
        text, k = (text + " " + words[k % len(words)]).strip(), k + 1
    n = len(tokenizer.encode(text, allowed_special="all"))
    page.check("input[name=iv][value=none]")
    idle(page)
    start = page.evaluate("() => performance.now()")
    page.fill("#prompt", text)
    page.press("#prompt", "Enter")
    idle(page)
    first = page.evaluate("() => performance.now()") - start
    h = heatmap(page)
    assert (h["rows"], h["cols"]) == (n, n)
    page.evaluate("() => { window.glass.timings.length = 0; }")
    renders = []
    for layer, head in [(0, 0), (1, 0), (2, 1), (3, 2), (2, 3), (0, 3), (1, 2), (3, 0)] * 2:
        page.click(f"#layers button[data-layer='{layer}']")
        idle(page)
        renders.append(page.evaluate("() => window.glass.lastRenderMs"))
        page.click(f"#heads button[data-head='{head}']")
        idle(page)
        renders.append(page.evaluate("() => window.glass.lastRenderMs"))
    switches = [t["ms"] for t in page.evaluate("() => window.glass.timings")]
    page.select_option("#snapshot", "mlp.gate")
    idle(page)
    vector = page.evaluate("() => window.glass.lastRenderMs")
    # No element per cell: the page is its fixed parts plus three elements per token chip.
    chips = page.evaluate("() => document.getElementById('tokens').getElementsByTagName('*').length")
    assert chips <= 3 * n
    assert page.evaluate("() => document.getElementsByTagName('*').length") - chips < 900
    timings = {
        "model": kind, "prompt_tokens": n,
        "first_view_ms (tokenize + trace + render)": round(first, 1),
        "switch_layer_or_head_ms": {"median": round(statistics.median(switches), 2), "max": round(max(switches), 2),
                                    "count": len(switches)},
        "render_only_ms": {"median": round(statistics.median(renders), 2), "max": round(max(renders), 2)},
        "render_mlp_gate_256x352_ms": round(vector, 2),
    }
    (ARTIFACTS / "inspector-timings.json").write_text(json.dumps(timings, indent=1) + "\n")
    print("\ninspector timings:", json.dumps(timings))
    page.close()


def test_exported_file_offline(browser, inspector, parts, tmp_path):
    from glassllm.inspector import export_html

    model, tokenizer, _, _ = parts
    path = tmp_path / "inspector.html"
    export_html(inspector, PROMPT, path, steps=2)
    page = browser.new_page()
    blocked, errors = [], []

    def only_files(route):
        if route.request.url.startswith("file:"):
            route.continue_()
        else:
            blocked.append(route.request.url)
            route.abort()
    page.route("**/*", only_files)
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(path.as_uri())
    assert page.evaluate("() => window.glass.state.mode") == "export"
    walk_through(page, model, tokenizer, typed=False)
    # Under an ablation of layer 2, a view the pass computes before it holds the plain numbers (offline,
    # from the plain view); one after it was not exported.
    page.evaluate("() => window.glass.intervene({kind: 'ablate', layer: 2, head: 1})")
    idle(page)
    ids = tokenizer.encode(PROMPT, allowed_special="all")
    for view, shown in (("{name: 'attn.softmax', layer: 1, head: 0}", True), ("{name: 'attn.q', layer: 2, head: 1}", True),
                        ("{name: 'resid_post', layer: 2}", False)):
        page.evaluate(f"() => window.glass.select({view})")
        idle(page)
        assert page.is_hidden("#view-error") == shown, view
    page.evaluate("() => window.glass.select({name: 'attn.softmax', layer: 1, head: 0})")
    idle(page)
    np.testing.assert_array_equal(np.array(heatmap(page)["values"]).reshape(len(ids), len(ids)),
                                  traced(model, ids).get("attn.softmax", layer=1, head=0))
    # With the mask off, the scores' numbers are the same but their drawn mask is not: those come from the
    # export's own mask-off view, never from the plain one.
    page.evaluate("() => window.glass.intervene({kind: 'mask_off', layer: 1})")
    page.evaluate("() => window.glass.select({name: 'attn.scores', layer: 1, head: 0})")
    idle(page)
    masked = page.evaluate("() => window.glass.heatmap.masked ? Array.from(window.glass.heatmap.masked) : null")
    assert page.is_visible("#view-error") or not any(masked or [])
    # Lesson 11's experiment, offline: ablate a layer-0 head, then read layer 1 (and every head at once).
    from glassllm.trace import ZeroAblate

    page.evaluate("() => window.glass.intervene({kind: 'ablate', layer: 0, head: 2})")
    page.evaluate("() => window.glass.select({name: 'attn.softmax', layer: 1, head: 2})")
    idle(page)
    assert page.is_hidden("#view-error") and page.is_visible("#compare")
    ablated = traced(model, ids, interventions=[ZeroAblate(0, 2)])
    np.testing.assert_array_equal(np.array(heatmap(page)["values"]).reshape(len(ids), len(ids)),
                                  ablated.get("attn.softmax", layer=1, head=2))
    page.evaluate("() => window.glass.tab('heads')")
    idle(page)
    assert page.is_hidden("#grid-error")
    grid = np.array(page.evaluate("() => Array.from(window.glass.grid.values)")).reshape(4, 4, len(ids), len(ids))
    # The export holds the grid's weights as float16 (the page only draws them): the page decodes them exactly.
    weights = np.where(np.triu(np.ones((len(ids), len(ids)), bool), 1), 0, ablated.get("attn.softmax", layer=3))
    np.testing.assert_array_equal(grid[3], weights.astype(np.float32).astype(np.float16))
    page.evaluate("() => window.glass.tab('heatmap')")
    assert blocked == [] and errors == []
    ARTIFACTS.mkdir(exist_ok=True)
    page.screenshot(path=str(ARTIFACTS / "inspector-export.png"), full_page=True)
    page.close()


# ----------------------------------------------------------------------------
# What a learner does that the walk-through does not: fast clicks, dead ends, odd prompts
# ----------------------------------------------------------------------------

def _ready(page):
    page.wait_for_function("() => window.glass && window.glass.ready === true")
    idle(page)


def opened(browser, url: str, view: str | None = None):
    """A new page at ``url``, ready, showing ``view`` (a JS object for ``glass.select``) if given."""
    page = browser.new_page()
    page.goto(url)
    _ready(page)
    if view is not None:
        page.evaluate(f"() => window.glass.select({view})")
        idle(page)
    return page


def test_fast_steps_never_run_past_the_text_and_failed_views_are_greyed_out(browser, server):
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    page.goto(server.url)
    _ready(page)
    page.evaluate("() => window.glass.run('The end.<|endoftext|>')")
    idle(page)
    for _ in range(6):                                                   # clicks faster than steps load
        page.evaluate("() => document.getElementById('step').click()")
    idle(page)
    shown = int(page.get_attribute("#step-line", "data-step"))
    assert page.evaluate("() => window.glass.state.step") == shown       # the state is the step on screen
    if page.evaluate("() => window.glass.state.finished"):
        assert page.is_disabled("#step")

    # The gradient of the boolean mask has nothing to show: asked for, the page shows the mask's values.
    page.evaluate("() => window.glass.reset()")
    idle(page)
    page.evaluate("() => window.glass.select({name: 'attn.softmax', layer: 1, head: 2, grad: true})")
    page.evaluate("() => window.glass.select({name: 'attn.mask'})")
    idle(page)
    assert page.evaluate("() => window.glass.state.grad") is False and "attn.mask" in page.inner_text("#view-name")
    assert page.is_disabled("#showwhat button[data-grad='1']")
    # A view that fails (under an edit the server refuses: an rms of 0 would divide by zero): its heading
    # says so, the previous heatmap is greyed out, and the lines under it no longer describe that view.
    page.evaluate("() => window.glass.select({name: 'attn.softmax', layer: 1, head: 2})")
    idle(page)
    hover(page, 2, 1)
    page.evaluate("() => window.glass.intervene({kind: 'edit', layer: 0, name: 'attn_norm.rms', row: 0, col: 0, "
                  "value: 0})")
    idle(page)
    assert "not shown" in page.inner_text("#view-name")
    assert page.evaluate("() => document.getElementById('heatmap-wrap').classList.contains('stale')")
    assert page.get_attribute("#readout", "data-value") is None and page.inner_text("#rowsum-line") == ""
    page.evaluate("() => window.glass.intervene(null)")
    idle(page)
    assert not page.evaluate("() => document.getElementById('heatmap-wrap').classList.contains('stale')")

    # Query head 3, then a snapshot without heads, then keys: the K/V head that query head 3 reads.
    page.evaluate("() => window.glass.select({name: 'attn.softmax', head: 3})")
    page.evaluate("() => window.glass.select({name: 'resid_post'})")
    page.evaluate("() => window.glass.select({name: 'attn.k'})")
    idle(page)
    assert page.evaluate("() => window.glass.state.head") == 3 * 2 // 4  # 4 query heads share 2 K/V heads
    assert errors == []
    page.close()


def test_an_exported_prompt_with_crlf_opens_and_step_stops_at_the_last_saved(browser, inspector, tmp_path):
    from glassllm.inspector import export_html

    path = tmp_path / "crlf.html"
    export_html(inspector, "Hello\r\nworld, once upon a time", path, steps=2)
    page = opened(browser, path.as_uri())
    assert "not included" not in page.inner_text("#view-error") or page.is_hidden("#view-error")
    assert page.evaluate("() => window.glass.heatmap && window.glass.heatmap.rows") > 0
    for _ in range(4):
        page.evaluate("() => window.glass.step()")
        idle(page)
    assert page.evaluate("() => window.glass.state.step") <= 2 and page.is_disabled("#step")
    page.close()


def test_heads_and_layers_answer_the_keyboard(browser, server):
    page = opened(browser, server.url, "{name: 'attn.softmax', layer: 0, head: 0}")
    page.focus("#heads button[data-head='0']")
    page.keyboard.press("ArrowRight")
    idle(page)
    assert page.evaluate("() => window.glass.state.head") == 1
    focused = page.evaluate("() => [document.activeElement.dataset.head, document.activeElement.getAttribute('aria-checked')]")
    assert focused == ["1", "true"]                                      # the rebuilt button keeps the focus
    page.focus("#layers button[data-layer='0']")
    page.keyboard.press("ArrowLeft")                                     # wraps to the last layer
    idle(page)
    assert page.evaluate("() => window.glass.state.layer") == len(page.query_selector_all("#layers button")) - 1
    # One Tab stop per group: from the chosen layer, Tab reaches the snapshot list, the chosen head, then
    # value/gradient -- not every button on the way.
    page.focus(f"#layers button[data-layer='{page.evaluate('() => window.glass.state.layer')}']")
    stops = []
    for _ in range(3):
        page.keyboard.press("Tab")
        stops.append(page.evaluate("() => [document.activeElement.id || document.activeElement.parentElement.id, "
                                   "document.activeElement.tagName === 'SELECT' ? '' : document.activeElement.innerText]"))
    assert stops == [["snapshot", ""], ["heads", "1"], ["showwhat", "value"]]
    page.close()


def test_every_vocabulary_column_can_be_hovered(browser, server, parts):
    """probs is (n, 1,024): each id gets at least one pixel, so a sweep of the mouse reaches them all."""
    page = opened(browser, server.url, "{name: 'probs'}")
    h = heatmap(page)
    assert h["cols"] == parts[0].config.vocab_size
    box = page.evaluate("""() => { const c = document.getElementById('heatmap');
        return {w: c.getBoundingClientRect().width}; }""")
    assert box["w"] >= h["cols"]                                          # one CSS pixel or more per id
    page.close()


def test_a_candidate_can_be_picked_from_the_keyboard(browser, server):
    page = opened(browser, server.url)
    second = page.get_attribute("#bars li.bar:nth-child(2)", "data-id")
    page.focus("#bars li.bar:nth-child(2)")
    page.keyboard.press("Enter")
    idle(page)
    assert page.evaluate("() => [window.glass.state.grad, window.glass.state.target]") == [True, int(second)]
    page.close()


def test_nothing_on_the_page_describes_a_view_that_is_gone(browser, server, parts):
    """A value read by hovering is not left under another view; probs offer no (all-zero) gradient;
    the next-token panel says it is without the intervention; at temperature 0 ties rank by logit."""
    page = opened(browser, server.url, "{name: 'attn.softmax', layer: 0, head: 0}")
    hover(page, 3, 1)
    assert page.get_attribute("#readout", "data-value") is not None
    page.evaluate("() => window.glass.select({layer: 1})")
    idle(page)
    assert page.get_attribute("#readout", "data-value") is None          # not layer 0's number under layer 1
    assert "Hover a cell" in page.inner_text("#readout")

    page.evaluate("() => window.glass.select({name: 'logits', grad: true})")
    idle(page)
    page.evaluate("() => window.glass.select({name: 'probs'})")
    idle(page)
    assert page.evaluate("() => window.glass.state.grad") is False and page.is_disabled("#showwhat button[data-grad='1']")
    assert "logits" in page.get_attribute("#showwhat button[data-grad='1']", "title")
    page.click("#bars li.bar >> nth=1")                                  # a candidate's gradient, from probs
    idle(page)
    assert page.evaluate("() => [window.glass.state.name, window.glass.state.grad]") == ["logits", True]
    page.evaluate("() => window.glass.select({name: 'probs'})")
    idle(page)

    page.evaluate("() => window.glass.intervene({kind: 'ablate', layer: 1, head: 0})")
    idle(page)
    assert "without the intervention" in page.inner_text("#next-where")

    page.evaluate("() => window.glass.intervene(null)")
    idle(page)
    page.fill("#temperature", "0")
    page.dispatch_event("#temperature", "input")
    ids = [int(b.get_attribute("data-id")) for b in page.locator("#bars li.bar").all()]
    logits = page.evaluate("() => Array.from(window.glass.next.logits)")
    assert ids == sorted(range(len(logits)), key=lambda i: (-logits[i], i))[:len(ids)]   # by logit, not by id

    # An intervention during generation steps goes back to the prompt, and says so.
    for _ in range(2):
        page.evaluate("() => window.glass.step()")
        idle(page)
    page.check("input[name=iv][value=mask_off]")
    idle(page)
    assert page.evaluate("() => window.glass.state.step") == 0
    assert page.is_visible("#iv-reset-note") and "the 2 generated steps" in page.inner_text("#iv-reset-note")
    page.check("input[name=iv][value=none]")
    idle(page)
    assert page.is_hidden("#iv-reset-note")
    page.close()


def test_heatmap_cells_can_be_read_from_the_keyboard(browser, server):
    """Tab to the heatmap, then the arrow keys walk its cells; each shows the exact value the mouse would."""
    page = opened(browser, server.url, "{name: 'attn.softmax', layer: 1, head: 2}")
    h = heatmap(page)
    rows, cols = h["rows"], h["cols"]
    values = np.array(h["values"]).reshape(rows, cols)

    def shown():
        ro = page.locator("#readout")
        return int(ro.get_attribute("data-row")), int(ro.get_attribute("data-col")), ro.get_attribute("data-value")

    page.focus("#heatmap")
    page.keyboard.press("ArrowDown")                                      # the first key shows cell (0, 0)
    assert shown()[:2] == (0, 0) and page.locator("#tooltip").is_visible()
    for key, (i, j) in [("ArrowDown", (1, 0)), ("ArrowRight", (1, 1)), ("ArrowRight", (1, 2)),
                        ("ArrowLeft", (1, 1)), ("ArrowUp", (0, 1)), ("ArrowUp", (0, 1)),     # stops at the edge
                        ("PageDown", (rows - 1, 1)), ("End", (rows - 1, cols - 1)),
                        ("ArrowRight", (rows - 1, cols - 1)), ("Home", (rows - 1, 0))]:
        page.keyboard.press(key)
        i_, j_, value = shown()
        assert (i_, j_) == (i, j), key
        assert float(value) == values[i, j]                               # the exact number, as hovering gives
    page.keyboard.press("PageUp")
    page.keyboard.press("ArrowRight")                                     # (0, 1): key 1 is query 0's future
    assert shown()[:2] == (0, 1) and page.locator("#readout").inner_text().endswith("(masked)")
    page.keyboard.press("ArrowLeft")
    assert shown()[:2] == (0, 0) and not page.locator("#readout").inner_text().endswith("(masked)")
    page.keyboard.press("Escape")
    assert not page.locator("#tooltip").is_visible()
    page.close()


def test_one_number_can_be_edited_from_the_heatmap(browser, server, parts):
    """Pick a cell with the keyboard, press E, type a value: the cell shows it and the distribution moves,
    to the tracer's numbers with the same Edit."""
    from glassllm.trace import Edit

    model, tokenizer = parts[0], parts[1]
    page = opened(browser, server.url, "{name: 'attn.softmax', layer: 2, head: 3}")
    ids = tokenizer.encode("Once upon a time", allowed_special="all")
    page.focus("#heatmap")
    for key in ["ArrowDown"] * 3 + ["ArrowRight"]:                    # (0, 0), then down to row 2, then (2, 1)
        page.keyboard.press(key)
    assert page.get_attribute("#readout", "data-row") == "2" and page.get_attribute("#readout", "data-col") == "1"
    page.keyboard.press("e")
    page.wait_for_function("() => document.activeElement.id === 'iv-value'")   # after the edit is applied as is
    idle(page)
    assert page.is_checked("input[name=iv][value=edit]")
    page.fill("#iv-value", "0.9")
    page.press("#iv-value", "Enter")
    page.dispatch_event("#iv-value", "change")
    idle(page)

    assert page.evaluate("() => window.glass.state.intervention") == {
        "kind": "edit", "layer": 2, "name": "attn.softmax", "head": 3, "row": 2, "col": 1, "value": 0.9}
    h = heatmap(page)
    assert h["values"][2 * h["cols"] + 1] == float(np.float32(0.9))     # the view shows the edited number

    def set_cell(a):
        a[3, 2, 1] = 0.9
        return a
    ref = traced(model, ids, interventions=[Edit("layers.2.attn.softmax", set_cell)])
    np.testing.assert_array_equal(np.array(h["values"]).reshape(h["rows"], h["cols"]),
                                  ref.get("attn.softmax", layer=2, head=3))
    got = page.evaluate("() => Array.from(window.glass.next.after)")
    np.testing.assert_allclose(got, softmax64(ref.get("logits")[-1], 1.0), rtol=1e-12, atol=1e-300)
    assert "layers.2.attn.softmax, head 3, cell (2, 1) set to 0.9" in page.inner_text("#iv-summary")
    assert page.inner_text("#rowsum-line").startswith("Not every row sums to 1")   # row 2 no longer does
    # A value out of range keeps the last one, and says so; Escape goes back to the heatmap.
    page.fill("#iv-value", "1e30")
    page.dispatch_event("#iv-value", "change")
    idle(page)
    assert page.evaluate("() => window.glass.state.intervention.value") == 0.9
    assert "still applied: 0.9" in page.inner_text("#iv-value-note")
    assert heatmap(page)["values"][2 * h["cols"] + 1] == float(np.float32(0.9))
    page.press("#iv-value", "Escape")
    assert page.evaluate("() => document.activeElement.id") == "heatmap"

    # With the mouse: a click picks the cell; crossing others on the way to the button does not change it.
    page.check("input[name=iv][value=none]")
    idle(page)
    at = page.evaluate("() => window.glass.heatmap.cellCenter(3, 2)")
    page.locator("#heatmap").click(position=at)
    for i, j in [(3, 3), (1, 1), (0, 0)]:
        page.locator("#heatmap").hover(position=page.evaluate(f"() => window.glass.heatmap.cellCenter({i}, {j})"))
    assert page.inner_text("#edit-cell") == "Edit cell (3, 2)"
    page.click("#edit-cell")
    page.wait_for_function("() => document.activeElement.id === 'iv-value'")
    idle(page)
    assert page.inner_text("#iv-cell").startswith("layers.2.attn.softmax, head 3, cell (3, 2)")
    # Under another intervention, "was" is the number without it (the edit replaces it).
    page.evaluate("() => window.glass.intervene({kind: 'ablate', layer: 1, head: 0})")
    idle(page)
    page.locator("#heatmap").click(position=at)
    page.click("#edit-cell")
    page.wait_for_function("() => window.glass.state.intervention.kind === 'edit'")
    idle(page)
    plain = traced(model, ids).get("attn.softmax", layer=2, head=3)[3, 2]
    assert page.inner_text("#iv-cell").endswith(f"was {str(plain)}")     # float32's shortest digits, as read out
    assert page.evaluate("() => window.glass.state.intervention.kind") == "edit"
    # A future key cannot be edited: masked by rule.
    page.locator("#heatmap").click(position=page.evaluate("() => window.glass.heatmap.cellCenter(0, 3)"))
    assert page.is_disabled("#edit-cell")
    # Not even when the view shows it unmasked, with the mask switched off: the edit would replace that switch.
    page.evaluate("() => window.glass.intervene({kind: 'mask_off', layer: 2})")
    idle(page)
    assert not heatmap(page)["values"][3] == 0.0                          # (0, 3) now holds a real weight
    page.locator("#heatmap").click(position=page.evaluate("() => window.glass.heatmap.cellCenter(0, 3)"))
    assert page.is_disabled("#edit-cell") and "future key" in page.get_attribute("#edit-cell", "title")

    # A gradient view cannot be edited; the button says so by being off.
    page.evaluate("() => window.glass.select({grad: true})")
    idle(page)
    page.focus("#heatmap")
    page.keyboard.press("ArrowRight")
    assert page.is_disabled("#edit-cell")
    page.close()
