"""glassllm.show_attention: attention weights of any model, given as arrays, in the offline inspector page.

Checked here on the page's embedded data: the heatmap answers hold the given numbers bit for bit (float32
and float64), the head grid holds every head, the mask is inferred from exact zeros above the diagonal or
taken as given, anything with ``__array__`` is accepted, and bad input is refused in one line. The
Chromium test on TransformerLens' own pattern is in tests/test_transformer_lens.py.
"""

from __future__ import annotations

import base64
import html
import json
import re

import numpy as np
import pytest

import glassllm


def _data(view) -> dict:
    (escaped,) = re.findall(r'srcdoc="([^"]*)"', view._repr_html_())
    (raw,) = re.findall(r'<script id="glass-data" type="application/json">(.*?)</script>', html.unescape(escaped), re.S)
    return json.loads(raw)


def _array(enc: dict) -> np.ndarray:
    return np.frombuffer(base64.b64decode(enc["b64"]), dtype=np.dtype(enc["dtype"]).newbyteorder("<")).reshape(
        enc["shape"])


def _views(data) -> dict:
    return {(b["name"], b.get("layer"), b.get("head")): r for k, r in data["responses"].items()
            if k.startswith("snapshot:") for b in [json.loads(k.split(":", 1)[1])] if not b.get("grad")}


def _weights(rng, L, H, n, causal: bool, dtype=np.float32):
    z = rng.normal(size=(L, H, n, n))
    if causal:
        z = np.where(np.triu(np.ones((n, n), bool), 1), -np.inf, z)
    e = np.exp(z - z.max(-1, keepdims=True))
    return (e / e.sum(-1, keepdims=True)).astype(dtype)


def test_the_page_holds_the_given_weights_and_infers_the_mask(tmp_path):
    pytest.importorskip("fastapi")
    rng = np.random.default_rng(0)
    a = np.concatenate([_weights(rng, 1, 3, 5, True), _weights(rng, 1, 3, 5, False)])      # layer 1: not causal
    tokens = ["The", " cat", " sat", " on", " it"]
    view = glassllm.show_attention(a, tokens)
    assert view.title == "attention: 2 layers, 3 heads, 5 tokens"
    data = _data(view)
    assert data["info"]["source"] == {"kind": "arrays", "layers": 2, "heads": 3, "tokens": 5}
    views = _views(data)
    for layer in range(2):
        for head in range(3):
            r = views[("attn.softmax", layer, head)]
            assert r["rows"] == r["cols"] == tokens
            np.testing.assert_array_equal(_array(r["values"]), a[layer, head])              # bit for bit
            masked = _array(r["masked"]).astype(bool)
            np.testing.assert_array_equal(masked, np.triu(np.ones((5, 5), bool), 1) if layer == 0 else False)
    (grid,) = [r for k, r in data["responses"].items() if k.startswith("heads:")]
    # The head grid's weights travel as float16 (the page only draws them): the nearest float16, exactly.
    np.testing.assert_array_equal(_array(grid["values"]), np.asarray(a, np.float32).astype(np.float16))
    view.save(tmp_path / "attention.html")
    assert (tmp_path / "attention.html").read_text(encoding="utf-8") == view.page

    # float64 stays float64; a given mask wins; one layer (H, n, n) is enough; anything with __array__ works.
    class Weights:
        def __array__(self, dtype=None, copy=None):
            return a[1].astype(np.float64)
    mask = np.zeros((5, 5), bool)
    mask[:, 0] = True
    data = _data(glassllm.show_attention(Weights(), tokens, mask=mask))
    r = _views(data)[("attn.softmax", 0, 2)]
    assert r["values"]["dtype"] == "float64"
    np.testing.assert_array_equal(_array(r["values"]), a[1, 2].astype(np.float64))
    np.testing.assert_array_equal(_array(r["masked"]).astype(bool), mask)


@pytest.mark.parametrize("attention, tokens, options, message", [
    (np.ones((2, 3, 4)) / 4, ["a", "b", "c"], {}, r"\(H, n, n\) or \(L, H, n, n\).*got shape \(2, 3, 4\)"),
    (np.ones((3, 3)), ["a", "b", "c"], {}, r"got shape \(3, 3\)"),
    (np.full((1, 2, 2), np.nan), ["a", "b"], {}, "NaN or infinite"),
    (np.ones((1, 2, 2)), ["a"], {}, "tokens has 1 strings but the attention covers 2 positions"),
    (np.ones((1, 2, 2)), "ab", {}, "tokens must be a list of 2 strings"),
    (np.ones((1, 2, 2)), ["a", "b"], {"mask": np.zeros((3, 3), bool)}, r"mask must be \(n, n\)"),
    (np.ones((1, 2, 2)), ["a", "b"], {"mask": np.zeros((2, 2))}, "mask must be booleans"),
    ("weights", ["a"], {}, "attention must be an array"),
    (np.ones((1, 2, 2), dtype=complex), ["a", "b"], {}, "real numbers, got complex128"),
])
def test_bad_input_is_refused_in_one_line(attention, tokens, options, message):
    pytest.importorskip("fastapi")
    with pytest.raises(ValueError, match=message) as info:
        glassllm.show_attention(attention, tokens, **options)
    assert "\n" not in str(info.value)
