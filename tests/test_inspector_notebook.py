"""The inspector inside Jupyter: glassllm.show(prompt) and Trace.show() render inline, offline.

The display object is the offline page (the ``--html`` export, fewer views) in
an ``<iframe srcdoc=...>``. Checked here: what Jupyter is given, that the page
holds the numbers glassllm computes (for a trace: the trace's own), that bad
arguments are refused in one line, and, in Chromium, that a notebook executed
with nbclient and exported with nbconvert draws the inspector on canvas with
no console error and no network request.
"""

from __future__ import annotations

import base64
import html
import io
import json
import os
import re
import tempfile
import time

import numpy as np
import pytest

import glassllm
from glassllm.checkpoint import bundled_model_path, load_bundled
from glassllm.trace import ZeroAblate, trace
from tests.test_inspector_browser import browser  # noqa: F401  (a fixture: Chromium, or a skip saying why)

pytest.importorskip("fastapi")
pytestmark = pytest.mark.skipif(not bundled_model_path().exists(), reason="needs the bundled model")

PROMPT = "Once upon a time"
SRCDOC = re.compile(r'srcdoc="([^"]*)"')


@pytest.fixture(scope="module")
def bundled():
    return load_bundled()


def _page(view) -> str:
    (escaped,) = SRCDOC.findall(view._repr_html_())
    return html.unescape(escaped)


def _data(page: str) -> dict:
    (raw,) = re.findall(r'<script id="glass-data" type="application/json">(.*?)</script>', page, re.S)
    return json.loads(raw)


def _array(enc: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(enc["b64"]), dtype=np.dtype(enc["dtype"]).newbyteorder("<")).reshape(
        enc["shape"])


def test_show_gives_jupyter_the_offline_page_in_a_sandboxed_frame(bundled):
    model, tokenizer, _ = bundled
    view = glassllm.show(PROMPT)
    bundle = view._repr_mimebundle_()
    assert set(bundle) == {"text/html", "text/plain", "image/png"} and bundle["text/plain"] == repr(view)
    frame = bundle["text/html"]
    # Scripts and the Save buttons' downloads only: no same-origin access to the notebook, no navigation.
    assert frame.startswith("<iframe") and 'sandbox="allow-scripts allow-downloads"' in frame
    assert "<script" not in frame.split("srcdoc=", 1)[1].split('"', 2)[1]     # escaped: no markup in the attribute
    page = _page(view)
    assert page == view.page
    assert "connect-src 'none'" in page and "default-src 'none'" in page      # the export's CSP: no network
    # The weights of layer 1, head 2, as the page will draw them, are glassllm's.
    data = _data(page)
    keys = [k for k in data["responses"] if k.startswith("snapshot:")]
    (key,) = [k for k in keys if json.loads(k.split(":", 1)[1]) == {"head": 2, "layer": 1, "name": "attn.softmax",
                                                                      "prompt": PROMPT}]
    ids = tokenizer.encode(PROMPT)
    want = trace(model, ids, names=["layers.1.attn.softmax"]).get("attn.softmax", layer=1, head=2)
    np.testing.assert_allclose(_array(data["responses"][key]["values"]), want, rtol=1e-5, atol=1e-7)  # float32
    # Smaller than the --html file: the default views only, no interventions.
    names = {json.loads(k.split(":", 1)[1])["name"] for k in keys}
    assert names == set(glassllm.inspector.notebook.INLINE_NAMES)
    assert not [k for k in data["responses"] if '"intervention"' in k]
    assert len(page.encode("utf-8")) < 2_000_000


def test_show_takes_a_model_object_or_a_file_and_more_views(bundled, tmp_path):
    model, tokenizer, _ = bundled
    view = glassllm.show(PROMPT, model, tokenizer, steps=0, names=["attn.softmax"], interventions=True)
    data = _data(view.page)
    names = {json.loads(k.split(":", 1)[1]).get("name") for k in data["responses"] if k.startswith("snapshot:")}
    assert names == {"attn.softmax"}
    assert [k for k in data["responses"] if '"kind":"ablate"' in k]
    file_view = glassllm.show(PROMPT, bundled_model_path(), steps=0, names="attn.softmax")
    assert _data(file_view.page)["responses"].keys() <= data["responses"].keys()
    # TransformerLens' names for the same snapshot, and a glob, choose the page's names.
    for other in ("attn.hook_pattern", "pattern", ["blocks.*.attn.hook_pattern"]):
        again = glassllm.show(PROMPT, model, tokenizer, steps=0, names=other, interventions=True)
        assert _data(again.page)["responses"] == data["responses"], other
    globbed = _data(glassllm.show(PROMPT, model, tokenizer, steps=0, names="attn.*").page)
    shown = {json.loads(k.split(":", 1)[1]).get("name") for k in globbed["responses"] if k.startswith("snapshot:")}
    assert {"attn.q", "attn.softmax", "attn.head_out", "attn.out"} <= shown and all(
        n.startswith("attn.") for n in shown)
    view.save(tmp_path / "page.html")
    assert (tmp_path / "page.html").read_text(encoding="utf-8") == view.page


@pytest.mark.parametrize("args, kwargs, message", [
    (("",), {}, "prompt"),
    ((PROMPT,), {"steps": -1}, "steps must be in [0, 64], got -1"),
    ((PROMPT,), {"names": ["attn.nope"]}, "unknown snapshot name(s) 'attn.nope'"),
    ((PROMPT,), {"names": ["layers.1.attn.softmax"]}, "unknown snapshot name(s) 'layers.1.attn.softmax'; "
                                                      "expected layer-local names"),
    ((PROMPT,), {"height": 10}, "height must be in [200, 4000] (pixels), got 10"),
    ((PROMPT, object()), {}, "model= is a model object: pass its tokenizer= too"),
])
def test_show_refuses_bad_arguments_in_one_line(args, kwargs, message):
    with pytest.raises(ValueError) as e:
        glassllm.show(*args, **kwargs)
    assert message in str(e.value) and "\n" not in str(e.value)


def test_trace_show_shows_the_traces_own_numbers(bundled):
    model, tokenizer, _ = bundled
    ids = tokenizer.encode(PROMPT)
    # An ablated head: the page must show what the trace recorded, not a fresh forward pass.
    t = trace(model, ids, names=["attn.softmax", "attn.mask", "layers.2.attn.out", "logits"],
              interventions=[ZeroAblate(layer=0, head=1)])
    data = _data(_page(t.show(tokenizer)))
    assert data["prompt"] == tokenizer.decode(ids)
    assert {n["name"] for n in data["info"]["names"]} == {"attn.softmax", "attn.mask", "attn.out", "logits"}
    assert data["info"]["model"]["params"] == model.num_params()
    got = {(b["name"], b.get("layer"), b.get("head")): r for k, r in data["responses"].items()
           if k.startswith("snapshot:") and "error" not in r for b in [json.loads(k.split(":", 1)[1])]}
    np.testing.assert_array_equal(_array(got[("attn.softmax", 3, 1)]["values"]),
                                  t.get("attn.softmax", layer=3, head=1))
    np.testing.assert_array_equal(_array(got[("attn.out", 2, None)]["values"]), t.get("layers.2.attn.out"))
    (nxt,) = [r for k, r in data["responses"].items() if k.startswith("next:")]
    np.testing.assert_array_equal(_array(nxt["logits"]), t.get("logits")[-1])
    # Without a tokenizer the positions are labelled by id; without attn.mask the causal rule marks the future.
    plain = _data(_page(trace(model, ids, names=["layers.0.attn.softmax"]).show()))
    (r,) = [r for k, r in plain["responses"].items() if k.startswith("snapshot:") and "error" not in r
            and json.loads(k.split(":", 1)[1]).get("head") == 0]
    assert r["rows"] == [f"id {i}" for i in ids]
    np.testing.assert_array_equal(_array(r["masked"]).astype(bool), np.triu(np.ones((4, 4), dtype=bool), k=1))


def test_the_entry_point_shows_a_trace_or_a_prompt_and_needs_no_web_framework(bundled):
    """glassllm.inspector.show(trace) is Trace.show; glassllm.show is its facade; the notebook view and the
    offline export import no FastAPI (the page's files are read by inspector.assets)."""
    import subprocess
    import sys

    from glassllm import inspector

    model, tokenizer, _ = bundled
    t = trace(model, tokenizer.encode(PROMPT), names=["layers.0.attn.softmax", "logits"])
    assert _data(_page(inspector.show(t, tokenizer=tokenizer))) == _data(_page(t.show(tokenizer)))
    assert _data(_page(glassllm.show(t, tokenizer=tokenizer))) == _data(_page(t.show(tokenizer)))
    with pytest.raises(TypeError, match="takes no model"):
        inspector.show(t, model)
    code = ("import sys, glassllm.inspector.notebook, glassllm.inspector.export; "
            "print(sorted(m for m in sys.modules if m.split('.')[0] in ('fastapi', 'starlette', 'uvicorn')))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# ---------------------------------------------------------------------------------------------- in Chromium

CHROMIUM = os.environ.get("GLASSLLM_CHROMIUM", "/usr/bin/chromium")
ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
        "--disable-component-update"]
NOTEBOOK_CELLS = [
    "import glassllm\nglassllm.show('Once upon a time there was a little dog')",
    "from glassllm.checkpoint import load_bundled\nfrom glassllm.trace import trace\n"
    "model, tokenizer, _ = load_bundled()\n"
    "trace(model, tokenizer.encode('One day Max'), names=['attn.softmax', 'logits']).show(tokenizer)",
]


def _unavailable(reason: str):
    if os.environ.get("GLASSLLM_REQUIRE_BROWSER") == "1":
        pytest.fail(f"GLASSLLM_REQUIRE_BROWSER=1 but the browser tests cannot run: {reason}")
    pytest.skip(f"needs a browser: {reason}")


@pytest.mark.browser
def test_an_executed_notebook_draws_the_inspector_inline_offline(tmp_path):
    nbformat = pytest.importorskip("nbformat")
    nbclient = pytest.importorskip("nbclient")
    nbconvert = pytest.importorskip("nbconvert")
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        _unavailable("Playwright's Python package is not installed (pip install playwright)")
    if not os.path.exists(CHROMIUM):
        _unavailable(f"Chromium is not installed at {CHROMIUM} (Debian: apt-get install chromium)")

    nb = nbformat.v4.new_notebook(cells=[nbformat.v4.new_code_cell(c) for c in NOTEBOOK_CELLS])
    nbclient.NotebookClient(nb, timeout=600, kernel_name="python3").execute()
    outputs = [o for c in nb.cells for o in c.outputs]
    assert not [o for o in outputs if o.output_type == "error"]
    assert sum("text/html" in o.get("data", {}) for o in outputs) == 2
    # Each keeps a picture of its first view, which a notebook opened untrusted (scripts off) shows instead.
    assert sum("image/png" in o.get("data", {}) for o in outputs) == 2
    # nbconvert's basic template: the cells' HTML alone, no page furniture that would load scripts from a CDN.
    body, _ = nbconvert.HTMLExporter(template_name="basic").from_notebook_node(nb)
    path = tmp_path / "notebook.html"
    path.write_text(f"<!doctype html><html><head><meta charset='utf-8'></head><body>{body}</body></html>",
                    encoding="utf-8")

    requests, errors = [], []
    with tempfile.TemporaryDirectory(prefix="glassllm-chromium-") as profile, sync_playwright() as p:
        try:
            context = p.chromium.launch_persistent_context(profile, executable_path=CHROMIUM, headless=True,
                                                           args=ARGS, viewport={"width": 1400, "height": 1000})
        except Exception as e:  # Playwright raises its own error type
            _unavailable(f"Chromium at {CHROMIUM} does not start: {str(e).splitlines()[0]}")
        try:
            page = context.pages[0] if context.pages else context.new_page()
            context.on("request", lambda r: requests.append(r.url))
            page.on("console", lambda m: errors.append(m.text) if m.type == "error" else None)
            page.on("pageerror", lambda e: errors.append(str(e)))
            page.goto(path.as_uri())
            frames = [f for f in page.frames if f is not page.main_frame]
            assert len(frames) == 2, [f.url for f in page.frames]
            for frame in frames:
                drawn = None
                for _ in range(300):                     # up to a minute on a loaded machine
                    drawn = frame.evaluate("""() => {
                        const h = window.glass && window.glass.heatmap;
                        if (!h) return null;
                        const c = document.getElementById("heatmap");
                        const px = c.getContext("2d").getImageData(0, 0, c.width, c.height).data;
                        let inked = 0;
                        for (let i = 0; i < px.length; i += 4) if (px[i + 3] && (px[i] < 200 || px[i + 2] < 200)) inked++;
                        return {name: h.name, rows: h.rows, cols: h.cols, labels: h.rowLabels.length, inked};
                    }""")
                    if drawn:
                        break
                    time.sleep(0.2)
                assert drawn, "the inline inspector never drew its heatmap"
                assert drawn["name"] == "layers.0.attn.softmax" and drawn["rows"] == drawn["cols"] == drawn["labels"]
                assert drawn["inked"] > 100, drawn
        finally:
            context.close()
    assert requests == [path.as_uri()], f"network requests beyond the notebook file: {requests}"
    assert not errors, errors


def test_a_saved_notebook_keeps_a_static_picture_of_the_first_view(bundled, tmp_path):
    """JupyterLab shows an untrusted notebook's outputs only in safe types (no script runs): the bundle's PNG of
    the first view is what appears there. It is Trace.plot's picture of the page's first view."""
    import matplotlib.image

    nbformat = pytest.importorskip("nbformat")
    view = glassllm.show(PROMPT, steps=0)
    bundle = view._repr_mimebundle_()
    assert set(bundle) == {"text/html", "text/plain", "image/png"}
    png = base64.b64decode(bundle["image/png"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n"
    path = tmp_path / "saved.ipynb"
    cell = nbformat.v4.new_code_cell("glassllm.show('Once upon a time')", outputs=[
        nbformat.v4.new_output("display_data", data=bundle)])
    nbformat.write(nbformat.v4.new_notebook(cells=[cell]), str(path))
    saved = nbformat.read(str(path), as_version=4).cells[0].outputs[0].data
    image = matplotlib.image.imread(io.BytesIO(base64.b64decode(saved["image/png"])), format="png")
    assert image.shape[:2] == (416, 512)                           # 6.4 x 5.2 inches at 80 dpi
    assert len(np.unique(image.reshape(-1, image.shape[-1]), axis=0)) > 20  # a drawn heatmap, not a blank


@pytest.mark.browser
def test_a_trace_of_one_later_layer_opens_on_that_layer(bundled, browser, tmp_path):
    """A trace that recorded layer 2 alone: the page opens on layer 2, drawn from the trace's own numbers."""
    model, tokenizer, _ = bundled
    ids = tokenizer.encode_prompt("Once upon a time there was a little dog")
    t = trace(model, ids, names=["layers.2.attn.softmax", "logits"])
    view = t.show(tokenizer)
    assert _data(_page(view))["info"]["first_layer"] == 2
    path = tmp_path / "layer2.html"
    view.save(path)
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(path.as_uri())
        page.wait_for_function("() => window.glass && window.glass.ready && window.glass.heatmap", timeout=60_000)
        shown = page.evaluate("() => ({name: glass.heatmap.name, head: glass.heatmap.head, values: "
                              "Array.from(glass.heatmap.values), error: document.getElementById('view-error').hidden"
                              " ? null : document.getElementById('view-error').textContent})")
    finally:
        page.close()
    assert not errors and shown["error"] is None, (errors, shown["error"])
    assert shown["name"] == "layers.2.attn.softmax" and shown["head"] == 0
    np.testing.assert_array_equal(np.array(shown["values"], dtype=np.float32),
                                  t.get("attn.softmax", layer=2, head=0).ravel())
