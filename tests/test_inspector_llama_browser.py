"""The inspector follows the model's shape: a SentencePiece Llama with L = 5, H = 8, G = 4, V = 512
(stories260K's shape), live and as the offline export, in Chromium (conventions of test_inspector_browser)."""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.glassllm_testing import randomize
from tests.test_inspector_browser import browser, heatmap, idle, pick, token_chips  # noqa: F401  (browser is a fixture)

pytestmark = pytest.mark.browser
PROMPT = "Once upon a time, Lily saw a café. 😀"


@pytest.fixture(scope="module")
def llama_inspector(tmp_path_factory):
    from glassllm.config import ModelConfig
    from glassllm.inspector import Inspector, Limits
    from glassllm.nn import Transformer
    from glassllm.sptokenizer import load_sentencepiece_model
    from tests.support.llama_fixtures import train_sentencepiece

    tok = load_sentencepiece_model(train_sentencepiece(tmp_path_factory.mktemp("sp"), vocab_size=512))
    config = ModelConfig(vocab_size=512, dim=64, n_layers=5, n_heads=8, n_kv_heads=4, ffn_dim=172, max_seq_len=128)
    model = randomize(Transformer(config, seed=0, dtype=np.float32), np.random.default_rng(5))
    return Inspector(model, tok, Limits(max_prompt_tokens=64, max_new_tokens=4)), model, tok


def _walk(page, model, tok):
    from glassllm.trace import trace

    page.wait_for_function("() => window.glass && window.glass.ready === true", timeout=60_000)
    idle(page)
    line = page.locator("#model-line").inner_text()
    assert all(w in line for w in ("5 layers", "8 query heads", "4 key/value heads", "D = 8", "V = 512")), line
    assert page.locator("#layers button").count() == 5
    ids = tok.encode_prompt(PROMPT)
    assert ids[0] == 1                                                  # <s> first, as the model reads it
    assert token_chips(page) == [p.replace(" ", "␣") for p in tok.pieces(ids)]
    pick(page, 4, "attn.softmax", 7)
    assert page.locator("#heads button").count() == 8
    h = heatmap(page)
    want = trace(model, np.array(ids)).get("attn.softmax", layer=4, head=7, step=0).astype(np.float64)
    n = len(ids)
    assert h["name"] == "layers.4.attn.softmax" and (h["rows"], h["cols"]) == (n, n)
    np.testing.assert_array_equal(np.array(h["values"]).reshape(n, n), want)
    page.select_option("#snapshot", "attn.k")
    idle(page)
    assert page.locator("#heads button").count() == 4
    assert page.evaluate("() => window.glass.heatmap.head") == 3       # query head 7 reads K/V head 3
    assert page.evaluate("() => window.glass.next.probs.length") == 512


def test_live_inspector_on_a_llama_shape(browser, llama_inspector):  # noqa: F811
    from glassllm.inspector import create_app
    from glassllm.inspector.server import Server

    inspector, model, tok = llama_inspector
    s = Server(create_app(inspector, prompt=PROMPT), "127.0.0.1", 0).start()
    try:
        page = browser.new_page()
        page.goto(s.url)
        _walk(page, model, tok)
        page.close()
    finally:
        s.stop()


def test_offline_export_on_a_llama_shape(browser, llama_inspector, tmp_path):  # noqa: F811
    from glassllm.inspector.export import export_html

    inspector, model, tok = llama_inspector
    export_html(inspector, PROMPT, tmp_path / "page.html", steps=1)
    page = browser.new_page()
    page.route("**/*", lambda r: r.continue_() if r.request.url.startswith("file:") else r.abort())
    page.goto((tmp_path / "page.html").as_uri())
    _walk(page, model, tok)
    page.close()
