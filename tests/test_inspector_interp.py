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
from glassllm_testing import randomize  # noqa: E402

PROMPT = "the cat sat on the mat"


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
