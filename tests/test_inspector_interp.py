"""The inspector's logit-lens and attribution answers equal glassllm.trace's, and bad requests get one line.

The model is a small random one made here; the references are ``logit_lens`` and
``logit_attrs`` (themselves checked against TransformerLens in tests/test_transformer_lens.py).
"""

from __future__ import annotations

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from glassllm.config import ModelConfig  # noqa: E402
from glassllm.inspector import Inspector, create_app  # noqa: E402
from glassllm.nn import Transformer  # noqa: E402
from glassllm.tokenizer import Tokenizer  # noqa: E402
from glassllm.trace import logit_attrs, logit_lens  # noqa: E402
from tests.support.glassllm_testing import randomize  # noqa: E402

PROMPT = "the cat sat on the mat. the dog ran to the cat"


@pytest.fixture(scope="module")
def setup():
    tok = Tokenizer.train(["the cat sat on the mat. the dog ran to the cat. " * 20], vocab_size=270)
    config = ModelConfig(vocab_size=270, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64)
    model = randomize(Transformer(config, seed=0, dtype=np.float64), np.random.default_rng(2))
    inspector = Inspector(model, tok)
    with TestClient(create_app(inspector), base_url="http://127.0.0.1") as client:
        yield model, tok, client


def test_lens_view_is_the_logit_lens(setup):
    model, tok, client = setup
    r = client.post("/api/lens", json={"prompt": PROMPT})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = tok.encode_prompt(PROMPT)
    lens = np.asarray(logit_lens(model, ids))                          # (L+1, n, V)
    assert body["streams"] == ["layers.0.resid_pre", "layers.1.resid_pre", "layers.1.resid_post"]
    assert body["top"] == lens.argmax(-1).tolist() and body["pieces"] == tok.pieces(ids)
    p = np.exp(lens - lens.max(-1, keepdims=True))
    np.testing.assert_allclose(body["prob"], (p / p.sum(-1, keepdims=True)).max(-1), rtol=1e-12)
    assert body["top_pieces"][0][0] == tok.piece(body["top"][0][0])


def test_attribution_view_is_logit_attrs(setup):
    model, tok, client = setup
    ids = tok.encode_prompt(PROMPT)
    r = client.post("/api/attribution", json={"prompt": PROMPT, "position": 2, "token": 7})
    assert r.status_code == 200, r.text
    body = r.json()
    want = np.asarray(logit_attrs(model, ids, 7))[:, 2]
    np.testing.assert_allclose(body["values"], want, rtol=1e-12, atol=1e-14)
    assert body["labels"][:2] == ["embed", "L0H0"] and body["token"] == 7 and body["position"] == 2
    assert sum(body["values"]) == pytest.approx(body["total"], abs=1e-10)
    default = client.post("/api/attribution", json={"prompt": PROMPT}).json()
    assert default["position"] == len(ids) - 1 and default["piece"] == tok.piece(default["token"])


@pytest.mark.parametrize("body,match", [
    ({"prompt": PROMPT, "position": 99}, "position 99 is out of range"),
    ({"prompt": PROMPT, "token": 270}, "token 270 is out of range"),
    ({"prompt": PROMPT, "position": -1}, "position"),
    ({"prompt": ""}, "prompt is empty"),
    ({"prompt": PROMPT, "head": 1}, "unknown field 'head'"),
])
def test_bad_attribution_requests_get_one_line(setup, body, match):
    _, _, client = setup
    r = client.post("/api/attribution", json=body)
    assert r.status_code == 400 and match in r.json()["error"] and "\n" not in r.json()["error"]


# ----------------------------------------------------------------------------
# The two views in a real browser, live and exported (skipped without Chromium, as the other browser tests)
# ----------------------------------------------------------------------------

from tests.test_inspector_browser import browser  # noqa: E402,F401  (the shared Chromium fixture)


def _check_views(page, model, tok):
    page.wait_for_function("() => window.glass && window.glass.ready === true", timeout=60_000)
    page.evaluate("() => window.glass.idle()")
    ids = tok.encode_prompt(PROMPT)
    lens = np.asarray(logit_lens(model, ids))
    shown = page.evaluate("() => window.glass.lens")
    assert shown["top"] == lens.argmax(-1).tolist()
    assert page.locator("#lens tr").count() == 1 + lens.shape[0]              # a header, then one row per stream
    assert page.locator("#lens tr").nth(1).locator("td").count() == min(len(ids), 12)   # the last 12 positions
    bars = page.evaluate("() => window.glass.attribution")
    np.testing.assert_allclose(bars["values"], np.asarray(logit_attrs(model, ids, bars["token"]))[:, -1],
                               rtol=1e-12, atol=1e-14)
    assert page.locator("#attr-bars li").count() == len(bars["labels"])
    assert page.locator("#attr-bars li").nth(1).get_attribute("data-label") == "L0H0"


@pytest.mark.browser
def test_lens_and_attribution_views_in_the_browser(browser, setup, tmp_path):  # noqa: F811
    from glassllm.inspector import Inspector, create_app, export_html
    from glassllm.inspector.server import Server

    model, tok, _ = setup
    inspector = Inspector(model, tok)
    server = Server(create_app(inspector, prompt=PROMPT), "127.0.0.1", 0).start()
    try:
        page = browser.new_page()
        errors = []
        page.on("pageerror", lambda e: errors.append(str(e)))
        page.goto(server.url)
        _check_views(page, model, tok)
        path = tmp_path / "inspector.html"
        export_html(inspector, PROMPT, path, steps=0)
        page.goto(path.as_uri())
        assert page.evaluate("() => window.glass.state.mode") == "export"
        _check_views(page, model, tok)
        assert not errors
    finally:
        server.stop()


@pytest.mark.browser
@pytest.mark.parametrize("kind, box, error_line", [("lens", "#lens", "#lens-error"),
                                                   ("attribution", "#attr-bars", "#attr-error")])
def test_a_view_that_cannot_be_had_shows_its_error_and_nothing_else(browser, setup, kind, box, error_line):  # noqa: F811
    """The server's one-line error is shown under the view, the view is empty, and the other view is drawn."""
    from glassllm.inspector import Inspector, create_app
    from glassllm.inspector.server import Server

    model, tok, _ = setup
    server = Server(create_app(Inspector(model, tok), prompt=PROMPT), "127.0.0.1", 0).start()
    try:
        page = browser.new_page()
        page.route(f"**/api/{kind}", lambda route: route.fulfill(status=400, json={"error": f"no {kind} today"}))
        page.goto(server.url)
        page.wait_for_function("() => window.glass && window.glass.ready === true", timeout=60_000)
        page.evaluate("() => window.glass.idle()")
        assert page.is_visible(error_line) and page.inner_text(error_line) == f"no {kind} today"
        assert page.evaluate(f"() => window.glass.{kind}") is None
        assert page.locator(f"{box} > *").count() == 0
        other = "attribution" if kind == "lens" else "lens"
        assert page.evaluate(f"() => window.glass.{other}") is not None
    finally:
        server.stop()
