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


def _softmax_top(lens):
    p = np.exp(lens - lens.max(-1, keepdims=True))                      # softmax, written out here
    return (p / p.sum(-1, keepdims=True)).max(-1)


def test_lens_view_is_the_logit_lens(setup):
    model, tok, client = setup
    r = client.post("/api/lens", json={"prompt": PROMPT})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = tok.encode_prompt(PROMPT)
    n = len(ids)
    assert n > 16                                                         # the default window is not everything
    lens = np.asarray(logit_lens(model, ids))                          # (L+1, n, V)
    assert body["streams"] == ["layers.0.resid_pre", "layers.1.resid_pre", "layers.1.resid_post"]
    assert body["positions"] == [n - 16, n] and body["length"] == n    # by default the last 16 positions
    assert body["top"] == lens[:, n - 16:].argmax(-1).tolist() and body["pieces"] == tok.pieces(ids)
    np.testing.assert_allclose(body["prob"], _softmax_top(lens[:, n - 16:]), rtol=1e-12)
    assert body["top_pieces"][0][0] == tok.piece(body["top"][0][0])
    assert body["earlier"] == [max(0, n - 32), n - 16] and body["later"] is None


def test_the_lens_windows_the_buttons_reach_cover_the_prompt_once(setup):
    model, tok, client = setup
    ids = tok.encode_prompt(PROMPT)
    lens = np.asarray(logit_lens(model, ids))
    body, seen = client.post("/api/lens", json={"prompt": PROMPT}).json(), []
    while True:
        start, stop = body["positions"]
        seen += range(start, stop)
        assert body["top"] == lens[:, start:stop].argmax(-1).tolist()
        np.testing.assert_allclose(body["prob"], _softmax_top(lens[:, start:stop]), rtol=1e-12)
        if body["earlier"] is None:
            break
        later = body["positions"]
        body = client.post("/api/lens", json={"prompt": PROMPT, "positions": body["earlier"]}).json()
        assert body["later"] == later                                    # and back again
    assert sorted(seen) == list(range(len(ids)))
    body = client.post("/api/lens", json={"prompt": PROMPT, "positions": [2, 5]}).json()
    assert body["positions"] == [2, 5] and body["top"] == lens[:, 2:5].argmax(-1).tolist()


@pytest.mark.parametrize("positions", [[5, 5], [9, 3], [0, 999], [-1, 4], [0, 80]])
def test_a_bad_lens_window_gets_400_and_one_line_naming_it(setup, positions):
    _, tok, client = setup
    n = len(tok.encode_prompt(PROMPT))
    r = client.post("/api/lens", json={"prompt": PROMPT, "positions": positions})
    want = (f"positions must be [start, stop) with 0 <= start < stop <= {n} (the prompt's positions), "
            f"at most 32 wide, got {positions}")
    assert r.status_code == 400 and r.json()["error"] == want


def test_a_lens_window_is_at_most_32_positions_wide():
    from glassllm.checks import ParameterError
    from glassllm.inspector.requests import check_lens_window
    from glassllm.inspector.schema import LensRequest

    assert check_lens_window(LensRequest(prompt="x", positions=(68, 100)), 100) == (68, 100)
    assert check_lens_window(LensRequest(prompt="x"), 100) == (84, 100)
    with pytest.raises(ParameterError, match=r"<= 100 \(the prompt's positions\), at most 32 wide, got \[67, 100\]$"):
        check_lens_window(LensRequest(prompt="x", positions=(67, 100)), 100)


@pytest.mark.parametrize("positions", [[1.5, 4], [1], "0:4"])
def test_a_lens_window_of_the_wrong_type_gets_400(setup, positions):
    r = setup[2].post("/api/lens", json={"prompt": PROMPT, "positions": positions})
    assert r.status_code == 400 and "positions" in r.json()["error"] and "\n" not in r.json()["error"]


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
    n = len(ids)
    lens = np.asarray(logit_lens(model, ids))
    windows = []
    while True:
        shown = page.evaluate("() => window.glass.lens")
        start, stop = shown["positions"]
        windows.append((start, stop))
        assert shown["top"] == lens[:, start:stop].argmax(-1).tolist()
        assert page.locator("#lens tr").count() == 1 + lens.shape[0]          # a header, then one row per stream
        assert page.locator("#lens tr").nth(1).locator("td").count() == stop - start
        assert page.locator("#lens tr").first.locator("th").nth(1).inner_text().startswith(f"{start} ")
        assert page.inner_text("#lens-note") == f"positions {start}–{stop - 1} of {n}"
        assert page.is_enabled("#lens-later") == (stop < n)
        if not page.is_enabled("#lens-earlier"):
            break
        page.click("#lens-earlier")
        page.evaluate("() => window.glass.idle()")
    assert windows[0] == (n - 16, n) and windows[-1][0] == 0 and len(windows) == -(-n // 16)
    page.click("#lens-later")                                                  # and back
    page.evaluate("() => window.glass.idle()")
    assert page.evaluate("() => window.glass.lens.positions") == list(windows[-2])
    bars = page.evaluate("() => window.glass.attribution")
    np.testing.assert_allclose(bars["values"], np.asarray(logit_attrs(model, ids, bars["token"]))[:, -1],
                               rtol=1e-12, atol=1e-14)
    assert page.locator("#attr-bars li").count() == len(bars["labels"])
    assert page.locator("#attr-bars li").nth(1).get_attribute("data-label") == "L0H0"


@pytest.mark.browser
def test_a_short_prompts_lens_shows_every_position_and_no_buttons(browser, setup):  # noqa: F811
    from glassllm.inspector import Inspector, create_app
    from glassllm.inspector.server import Server

    model, tok, _ = setup
    short = "the cat sat"
    server = Server(create_app(Inspector(model, tok), prompt=short), "127.0.0.1", 0).start()
    try:
        page = browser.new_page()
        page.goto(server.url)
        page.wait_for_function("() => window.glass && window.glass.ready === true", timeout=60_000)
        page.evaluate("() => window.glass.idle()")
        ids = tok.encode_prompt(short)
        assert len(ids) <= 16
        lens = np.asarray(logit_lens(model, ids))
        assert page.evaluate("() => window.glass.lens.top") == lens.argmax(-1).tolist()
        assert page.locator("#lens tr").nth(1).locator("td").count() == len(ids)
        assert not page.is_visible("#lens-nav") and page.inner_text("#lens-note") == ""
    finally:
        server.stop()


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
