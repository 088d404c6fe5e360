"""The inspector's server and data layer: exact numbers, bad input, limits, export, command line.

References: the independent PyTorch LLaMA of ``torch_reference.py`` in float64
on the same weights (snapshot values, gradients of the next-token loss,
decoding steps recomputed without a cache, interventions re-expressed as
weight edits), and :mod:`glassllm.sampling` for the survivors. Every bad
request must get HTTP 400 with a one-line JSON ``{"error": ...}``; nothing may
give a 500.

The model has the bundled model's shape (4 layers, 4 query heads, 2 key/value
heads, 1,024 ids) with random weights of a trained-like scale, and a tokenizer
trained here on generated text, so nothing needs ``../shared`` or the bundled file.
"""

from __future__ import annotations

import base64
import json
import re
import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from tests.support.glassllm_testing import randomize  # noqa: E402
from fastapi.testclient import TestClient  # noqa: E402

from glassllm.config import ModelConfig  # noqa: E402
from glassllm.inspector import Inspector, Limits, create_app, export_html  # noqa: E402
from glassllm.inspector.schema import SnapshotRequest, request_key  # noqa: E402
from glassllm.nn import Transformer  # noqa: E402
from glassllm.sampling import sampling_distribution  # noqa: E402

PROMPT = "once upon a time the little dog ran"


# ----------------------------------------------------------------------------
# A model and tokenizer of the bundled shape, made here (also used by the browser test)
# ----------------------------------------------------------------------------

def generated_text(seed: int = 0, words: int = 600, length: int = 20000) -> str:
    """Text of made-up words plus a few English ones: enough distinct pairs for 767 merges."""
    rng = np.random.default_rng(seed)
    letters = list("abcdefghijklmnopqrstuvwxyz")
    vocab = ["".join(rng.choice(letters, size=rng.integers(2, 9))) for _ in range(words)]
    vocab += "once upon a time there was the little dog ran and cat sat".split()
    return " ".join(rng.choice(vocab, size=length))


def make_model_and_tokenizer(dtype=np.float64, seed: int = 0):
    from glassllm.tokenizer import Tokenizer

    tokenizer = Tokenizer.train([generated_text(seed)], vocab_size=1024)
    model = randomize(Transformer(ModelConfig(), seed=seed, dtype=dtype), np.random.default_rng(seed + 1))
    return model, tokenizer


def decode_array(enc: dict) -> np.ndarray:
    dtype = {"float16": "<f2", "float32": "<f4", "float64": "<f8", "uint8": "u1"}[enc["dtype"]]
    return np.frombuffer(base64.b64decode(enc["b64"]), dtype=dtype).reshape(enc["shape"])


@pytest.fixture(scope="module")
def parts():
    return make_model_and_tokenizer(np.float64)


@pytest.fixture(scope="module")
def inspector(parts):
    model, tokenizer = parts
    return Inspector(model, tokenizer, Limits(max_prompt_tokens=64, max_new_tokens=6, max_cells=1 << 16))


@pytest.fixture(scope="module")
def client(inspector):
    # The base URL names a loopback host: the app refuses any other Host header.
    with TestClient(create_app(inspector, prompt=PROMPT), base_url="http://127.0.0.1") as c:
        yield c


@pytest.fixture(scope="module")
def reference(parts):
    torch = pytest.importorskip("torch")
    from tests.support.torch_reference import TorchLlama

    model, _ = parts
    ref = TorchLlama(model.config.to_dict(), dtype=torch.float64)
    ref.load_glassllm_state(model.state_dict())
    return ref


def post(client, kind: str, body):
    return client.post(f"/api/{kind}", json=body)


def torch_capture(ref, ids, target=None):
    """The reference's snapshots (batch row 0) and, with ``target``, their gradients of -log p(target)."""
    import torch

    capture = {}
    logits = ref(np.array([ids]), capture=capture)
    grads = {}
    if target is not None:
        loss = -torch.log_softmax(logits[0, -1], dim=-1)[target]
        loss.backward()
        grads = {k: t.grad[0].detach().numpy() for k, t in capture.items()
                 if getattr(t, "retains_grad", False) and t.grad is not None}
    # Every capture keeps the batch axis except the mask, which is (n, m) already.
    values = {k: (t if k.endswith("attn.mask") else t[0]).detach().numpy() for k, t in capture.items()}
    return values, grads, logits[0, -1].detach().numpy()


# ----------------------------------------------------------------------------
# Exact numbers
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("name, layer, head", [
    ("attn.softmax", 2, 3), ("attn.scores", 0, 1), ("attn.k", 1, 1), ("attn.rope_q", 3, 0),
    ("mlp.act", 2, None), ("resid_post", 3, None), ("attn_norm.rms", 1, None), ("embed", None, None),
    ("logits", None, None),
])
def test_snapshots_equal_the_pytorch_reference(client, parts, reference, name, layer, head):
    model, tokenizer = parts
    r = post(client, "snapshot", {"prompt": PROMPT, "name": name, "layer": layer, "head": head})
    assert r.status_code == 200, r.text
    body = r.json()
    ids = tokenizer.encode(PROMPT, allowed_special="all")
    values, _, _ = torch_capture(reference, ids)
    full = name if layer is None else f"layers.{layer}.{name}"
    want = values[full]
    if head is not None:
        want = want[head]
    if want.ndim == 1:
        want = want[:, None]
    got = decode_array(body["values"])
    assert got.shape == want.shape == tuple(body["shape"])
    np.testing.assert_allclose(got, want, rtol=1e-9, atol=1e-11)
    # Labels: rows are the prompt's tokens at their positions.
    assert body["rows"] == tokenizer.pieces(ids) and body["row_pos"] == list(range(len(ids)))
    assert (body["n"], body["m"], body["start"]) == (len(ids), len(ids), 0)
    if name in ("attn.softmax", "attn.scores"):
        assert body["cols"] == tokenizer.pieces(ids)
        masked = decode_array(body["masked"]).astype(bool)
        np.testing.assert_array_equal(masked, np.triu(np.ones((len(ids), len(ids)), bool), 1))


@pytest.mark.parametrize("name, layer, head", [
    ("attn.softmax", 2, 3), ("attn.v", 1, 0), ("mlp.gate", 0, None), ("resid_pre", 2, None), ("logits", None, None),
])
def test_gradients_equal_the_pytorch_reference(client, parts, reference, name, layer, head):
    model, tokenizer = parts
    ids = tokenizer.encode(PROMPT, allowed_special="all")
    _, _, last = torch_capture(reference, ids)
    target = int(np.argmax(last))
    for body_target in (None, 7):           # the model's top choice, then a chosen token
        r = post(client, "snapshot", {"prompt": PROMPT, "name": name, "layer": layer, "head": head,
                                      "grad": True, "target": body_target})
        assert r.status_code == 200, r.text
        body = r.json()
        want_target = target if body_target is None else body_target
        assert body["target"] == want_target and body["grad"] is True
        _, grads, _ = torch_capture(reference, ids, want_target)
        full = name if layer is None else f"layers.{layer}.{name}"
        want = grads[full] if head is None else grads[full][head]
        np.testing.assert_allclose(decode_array(body["values"]), want, rtol=1e-8, atol=1e-12)


def test_a_plain_snapshot_never_reports_a_cached_gradient_runs_target(client, parts, reference):
    """A value request may be answered from a cached run with gradients; it still says grad false, no target."""
    model, tokenizer = parts
    prompt = "a prompt seen first with gradients"
    r = post(client, "snapshot", {"prompt": prompt, "name": "logits", "grad": True, "target": 5})
    assert r.status_code == 200 and r.json()["target"] == 5
    body = post(client, "snapshot", {"prompt": prompt, "name": "logits"}).json()
    assert body["grad"] is False and body["target"] is None and body["target_piece"] is None
    _, _, last = torch_capture(reference, tokenizer.encode(prompt, allowed_special="all"))
    np.testing.assert_allclose(decode_array(body["values"])[-1], last, rtol=1e-8, atol=1e-10)  # values, not grads


def test_next_token_logits_and_survivors(client, parts, reference):
    _, tokenizer = parts
    ids = tokenizer.encode(PROMPT, allowed_special="all")
    _, _, last = torch_capture(reference, ids)
    for T, k, p in [(1.0, None, None), (0.7, 20, None), (1.5, None, 0.6), (0.0, 5, 0.9), (2.0, 40, 0.3)]:
        r = post(client, "next", {"prompt": PROMPT, "temperature": T, "top_k": k, "top_p": p})
        assert r.status_code == 200, r.text
        body = r.json()
        logits = decode_array(body["logits"])
        np.testing.assert_allclose(logits, last, rtol=1e-9, atol=1e-10)
        want = sampling_distribution(logits, T, k, p)
        np.testing.assert_array_equal(decode_array(body["sampled"]), want)
        assert sorted(body["survivors"]) == np.flatnonzero(want > 0).tolist()
        assert body["tokens"] == tokenizer.pieces(ids) and body["position"] == len(ids) - 1
        # the header's line: the inspector records every snapshot, so every layer ran its reference code
        assert body["paths"] == "layer paths: every layer ran its reference code"


def _reference_logits_with(reference, parts, edit):
    """Last-position logits of the reference after ``edit(state)`` changes a copy of the weights."""
    import torch
    from tests.support.torch_reference import TorchLlama

    model, tokenizer = parts
    state = {k: v.copy() for k, v in model.state_dict().items()}
    edit(state)
    ref = TorchLlama(model.config.to_dict(), dtype=torch.float64)
    ref.load_glassllm_state(state)
    ids = tokenizer.encode(PROMPT, allowed_special="all")
    return ref(np.array([ids]))[0, -1].detach().numpy()


def test_interventions_equal_weight_edits_of_the_reference(client, parts, reference):
    D = parts[0].config.head_dim

    # Ablating head 3 of layer 2 zeroes its mix: the same as zeroing its columns of W_O.
    def ablate(state):
        state["layers.2.attention.wo.weight"][:, 3 * D:4 * D] = 0.0
    r = post(client, "next", {"prompt": PROMPT, "intervention": {"kind": "ablate", "layer": 2, "head": 3}})
    assert r.status_code == 200, r.text
    body = r.json()
    after = decode_array(body["after"]["logits"])
    np.testing.assert_allclose(after, _reference_logits_with(reference, parts, ablate), rtol=1e-9, atol=1e-10)
    assert np.abs(after - decode_array(body["logits"])).max() > 1e-3  # it changed something

    # Dividing layer 1's scores by T = 4 equals dividing its queries (W_Q) by 4.
    def cool(state):
        state["layers.1.attention.wq.weight"] /= 4.0
    r = post(client, "next", {"prompt": PROMPT, "intervention": {"kind": "temperature", "layer": 1, "temperature": 4}})
    after = decode_array(r.json()["after"]["logits"])
    np.testing.assert_allclose(after, _reference_logits_with(reference, parts, cool), rtol=1e-9, atol=1e-10)


def test_editing_one_number_equals_recomputing_from_it(client, parts):
    """Set one coordinate of the last block's output at the last position: the logits are the final norm and
    the output matrix applied by hand to the traced vector with that number changed."""
    from glassllm.trace import trace

    model, tokenizer = parts
    ids = tokenizer.encode(PROMPT, allowed_special="all")
    n, c = len(ids), 17
    L = model.config.n_layers
    iv = {"kind": "edit", "layer": L - 1, "name": "resid_post", "row": n - 1, "col": c, "value": 3.5}
    r = post(client, "next", {"prompt": PROMPT, "intervention": iv})
    assert r.status_code == 200, r.text
    after = decode_array(r.json()["after"]["logits"])

    x = trace(model, np.array(ids), names=f"layers.{L - 1}.resid_post").get(f"layers.{L - 1}.resid_post")[-1].copy()
    x[c] = 3.5
    norm = x / np.sqrt(np.mean(x * x) + model.config.norm_eps) * model.norm.weight.data
    np.testing.assert_allclose(after, norm @ model.output.weight.data.T, rtol=1e-9, atol=1e-10)

    # The edited snapshot itself shows the new number, and nothing else of it changes.
    plain = post(client, "snapshot", {"prompt": PROMPT, "name": "resid_post", "layer": L - 1}).json()
    edited = post(client, "snapshot", {"prompt": PROMPT, "name": "resid_post", "layer": L - 1,
                                       "intervention": iv}).json()
    a, b = decode_array(plain["values"]), decode_array(edited["values"])
    assert b[n - 1, c] == 3.5 and np.array_equal(np.delete(a.ravel(), (n - 1) * a.shape[1] + c),
                                                 np.delete(b.ravel(), (n - 1) * b.shape[1] + c))


def test_mask_off_shows_the_future_in_that_layer_only(client, parts):
    iv = {"kind": "mask_off", "layer": 1}
    n = len(parts[1].encode(PROMPT, allowed_special="all"))
    body = post(client, "snapshot", {"prompt": PROMPT, "name": "attn.softmax", "layer": 1, "head": 0,
                                     "intervention": iv}).json()
    weights, masked = decode_array(body["values"]), decode_array(body["masked"])
    assert not masked.any()
    assert (weights[np.triu_indices(n, 1)] > 0).all()       # future keys get weight
    np.testing.assert_allclose(weights.sum(axis=1), 1.0, rtol=1e-12)
    other = post(client, "snapshot", {"prompt": PROMPT, "name": "attn.softmax", "layer": 2, "head": 0,
                                      "intervention": iv}).json()
    assert (decode_array(other["values"])[np.triu_indices(n, 1)] == 0).all()
    after = post(client, "next", {"prompt": PROMPT, "intervention": iv}).json()["after"]
    assert decode_array(after["logits"]).shape == (1024,)


def test_decoding_steps_match_recomputation_without_a_cache(client, parts, reference):
    _, tokenizer = parts
    ids = tokenizer.encode(PROMPT, allowed_special="all")
    seq = list(ids)
    for step in (1, 2, 3):
        # The token fed at this step is the greedy choice of the previous pass, recomputed without a cache.
        prev = reference(np.array([seq]))[0, -1].detach().numpy()
        seq.append(int(np.argmax(prev)))
        body = post(client, "snapshot", {"prompt": PROMPT, "name": "attn.softmax", "layer": 2, "head": 3,
                                         "step": step}).json()
        assert (body["n"], body["m"], body["start"]) == (1, len(ids) + step, len(ids) + step - 1)
        assert body["cols"] == tokenizer.pieces(seq) and body["rows"] == [tokenizer.piece(seq[-1])]
        values, _, last = torch_capture(reference, seq)
        np.testing.assert_allclose(decode_array(body["values"]), values["layers.2.attn.softmax"][3][-1:],
                                   rtol=1e-9, atol=1e-12)
        nxt = post(client, "next", {"prompt": PROMPT, "step": step}).json()
        np.testing.assert_allclose(decode_array(nxt["logits"]), last, rtol=1e-9, atol=1e-10)
        assert nxt["fed"]["id"] == seq[-1] and nxt["m"] == len(seq)


def test_info_lists_the_tracer_registry(client, parts):
    from glassllm.trace import registry

    info = client.get("/api/info").json()
    reg = registry(parts[0])
    names = {e["name"]: e for e in info["names"]}
    want = [k.removeprefix("layers.0.") for k in reg if k.startswith("layers.0.") or not k.startswith("layers.")]
    assert list(names) == want
    for local, entry in names.items():
        full = f"layers.0.{local}" if entry["in_layer"] else local
        assert entry["axes"] == list(reg[full])
    assert names["attn.q"]["heads"] == names["attn.softmax"]["heads"] == 4
    assert names["attn.k"]["heads"] == names["attn.v"]["heads"] == 2 and names["attn.out"]["heads"] == 0
    assert len(info["vocab"]) == 1024 and info["prompt"] == PROMPT


# ----------------------------------------------------------------------------
# Bad input: 400 and one JSON line, never a 500
# ----------------------------------------------------------------------------

BAD = [
    ("tokens", {"prompt": ""}, "prompt is empty"),
    ("snapshot", {"prompt": "", "name": "attn.q", "layer": 0, "head": 0}, "prompt is empty"),
    ("tokens", {"prompt": "once upon a time " * 40}, "at most 64"),
    ("next", {"prompt": "a" * 30000}, "prompt"),
    ("next", {"prompt": PROMPT, "temperature": -1}, "temperature"),
    ("next", {"prompt": PROMPT, "temperature": 1e9}, "temperature"),
    ("next", {"prompt": PROMPT, "top_k": 0}, "top_k"),
    ("next", {"prompt": PROMPT, "top_k": 5000}, "top_k 5000"),
    ("next", {"prompt": PROMPT, "top_p": 1.5}, "top_p"),
    ("snapshot", {"prompt": PROMPT, "name": "attn.nope", "layer": 0}, "unknown snapshot 'attn.nope'"),
    ("snapshot", {"prompt": PROMPT, "name": "../../etc/passwd", "layer": 0}, "unknown snapshot"),
    ("snapshot", {"prompt": PROMPT, "name": "attn.softmax", "layer": 4, "head": 0}, "layer 4"),
    ("snapshot", {"prompt": PROMPT, "name": "attn.softmax", "layer": -1, "head": 0}, "layer"),
    ("snapshot", {"prompt": PROMPT, "name": "attn.softmax", "layer": 2, "head": 5}, "head 5"),
    ("snapshot", {"prompt": PROMPT, "name": "attn.k", "layer": 2, "head": 2}, "head 2 is out of range"),
    ("snapshot", {"prompt": PROMPT, "name": "attn.softmax", "layer": 2}, "send a head"),
    ("snapshot", {"prompt": PROMPT, "name": "mlp.out", "layer": 2, "head": 0}, "no head axis"),
    ("snapshot", {"prompt": PROMPT, "name": "logits", "layer": 2}, "outside the layers"),
    ("snapshot", {"prompt": PROMPT, "name": "attn.q", "head": 0}, "send a layer"),
    ("snapshot", {"prompt": PROMPT, "name": "attn.q", "layer": "2", "head": 0}, "layer"),
    ("snapshot", {"prompt": PROMPT, "name": "attn.q", "layer": 1.5, "head": 0}, "layer"),
    ("snapshot", {"prompt": PROMPT, "name": "attn.mask", "layer": 0, "grad": True}, "no gradient"),
    ("snapshot", {"prompt": PROMPT, "name": "attn.q", "layer": 0, "head": 0, "step": 99}, "step 99"),
    ("snapshot", {"prompt": PROMPT, "name": "attn.q", "layer": 0, "head": 0, "step": 1, "grad": True}, "step 0"),
    ("snapshot", {"prompt": PROMPT, "name": "attn.q", "layer": 0, "head": 0, "target": 1024, "grad": True},
     "target 1024"),
    ("snapshot", {"prompt": PROMPT, "name": "attn.q", "layer": 0, "head": 0, "colour": "red"}, "unknown field"),
    ("snapshot", {"prompt": PROMPT, "layer": 0}, "missing field 'name'"),
    ("next", {"prompt": PROMPT, "intervention": {"kind": "explode", "layer": 0}}, "intervention.kind"),
    ("next", {"prompt": PROMPT, "intervention": {"kind": "ablate", "layer": 4, "head": 0}}, "layer=4"),
    ("next", {"prompt": PROMPT, "intervention": {"kind": "ablate", "layer": 0}}, "needs a head"),
    ("next", {"prompt": PROMPT, "intervention": {"kind": "temperature", "layer": 0, "temperature": 0}},
     "temperature"),
    ("next", {"prompt": PROMPT, "intervention": {"kind": "temperature", "layer": 0}}, "needs a temperature"),
    ("next", {"prompt": PROMPT, "intervention": {"kind": "temperature", "layer": 0, "temperature": 200.0}},
     "temperature 200.0 is out of range"),
    ("next", {"prompt": PROMPT, "intervention": {"kind": "ablate", "layer": 0, "head": -1}}, "head -1"),
    ("heads", {"prompt": PROMPT, "intervention": {"kind": "ablate", "layer": -1, "head": 0}}, "layer -1"),
    ("next", {"prompt": PROMPT, "step": 1, "intervention": {"kind": "mask_off", "layer": 0}}, "step 0"),
    ("next", {"prompt": PROMPT, "intervention": {"kind": "edit", "layer": 0, "name": "mlp.act", "row": 0, "col": 0}},
     "needs value"),
    ("next", {"prompt": PROMPT, "intervention": {"kind": "edit", "layer": 0, "name": "attn.mask", "row": 0, "col": 0,
                                                 "value": 1.0}}, "use 'mask_off'"),
    ("next", {"prompt": PROMPT, "intervention": {"kind": "edit", "layer": 0, "name": "mlp.act", "row": 99, "col": 0,
                                                 "value": 1.0}}, "cell (99, 0) is outside 'mlp.act'"),
    ("next", {"prompt": PROMPT, "intervention": {"kind": "edit", "layer": 0, "name": "logits", "row": 0, "col": 0,
                                                 "value": 1.0}}, "'logits' is not a snapshot inside the blocks"),
    ("next", {"prompt": PROMPT, "intervention": {"kind": "edit", "layer": 0, "name": "attn.q", "row": 0, "col": 0,
                                                 "value": 1.0}}, "needs a head in 0..3"),
    ("next", {"prompt": PROMPT, "intervention": {"kind": "edit", "layer": 0, "name": "mlp.act", "row": 0, "col": 0,
                                                 "value": 1e7}}, "value"),
    ("next", {"prompt": PROMPT, "intervention": {"kind": "ablate", "layer": 0, "head": 0, "value": 2.0}},
     "takes no name, row, col or value"),
    ("next", {"prompt": PROMPT, "intervention": {"kind": "edit", "layer": 0, "name": "attn.softmax", "head": 0,
                                                 "row": 0, "col": 1, "value": 0.5}}, "is a future key, masked"),
    ("snapshot", {"prompt": PROMPT, "name": "mlp.act", "layer": 1, "intervention": {
        "kind": "edit", "layer": 0, "name": "attn_norm.rms", "row": 0, "col": 0, "value": 0.0}},
     "arithmetic overflows or divides by zero; give smaller values, and no 0 where the model divides"),
    ("snapshot", [1, 2, 3], "JSON object"),
]


def test_a_hook_name_in_another_layer_is_refused_in_its_own_words(client):
    r = post(client, "snapshot", {"prompt": PROMPT, "name": "blocks.1.attn.hook_z", "layer": 0, "head": 0})
    assert r.status_code == 400 and r.json()["error"] == "name 'blocks.1.attn.hook_z' is in layer 1, but layer is 0"


def test_an_intervention_index_out_of_range_is_refused_with_the_range_the_api_takes(client):
    """The API takes layers and heads >= 0 (a negative one is refused): its errors offer no "-4..-1 from the end",
    which the Python API takes."""
    for iv, said in (({"kind": "ablate", "layer": 0, "head": 99}, "intervention head=99 is out of range: "
                                                                   "expected 0..3"),
                     ({"kind": "mask_off", "layer": 9}, "intervention layer=9 is out of range: expected 0..3")):
        r = post(client, "next", {"prompt": PROMPT, "intervention": iv})
        assert r.status_code == 400 and r.json()["error"] == said
        r = post(client, "next", {"prompt": PROMPT, "intervention": {**iv, "layer": -1}})
        assert r.status_code == 400 and "must be an int >= 0" in r.json()["error"]


@pytest.mark.parametrize("kind, body, message", BAD, ids=[f"{k}-{m}" for k, _, m in BAD])
def test_bad_requests_get_400_and_one_line(client, kind, body, message):
    r = post(client, kind, body)
    assert r.status_code == 400, r.text
    error = r.json()["error"]
    assert isinstance(error, str) and "\n" not in error and len(error) < 500
    assert message in error


@pytest.mark.parametrize("raw, message", [
    (b'{"prompt": "a", "temperature": NaN}', "temperature"),
    (b'{"prompt": "a", "temperature": Infinity}', "temperature"),
    (b'{"prompt": "a", "temperature": -0.5}', "temperature"),
    (b'{"prompt": "a",', "not valid JSON"),
    (b"", "JSON"),
    (b"\xff\xfe", "JSON"),
    (b'"just a string"', "JSON object"),
])
def test_malformed_bodies_get_400(client, raw, message):
    r = client.post("/api/next", content=raw, headers={"Content-Type": "application/json"})
    assert r.status_code == 400, r.text
    assert message in r.json()["error"]


def test_limits_on_snapshot_size_and_steps(parts):
    model, tokenizer = parts
    small = Inspector(model, tokenizer, Limits(max_prompt_tokens=8, max_new_tokens=2, max_cells=100))
    with TestClient(create_app(small), base_url="http://127.0.0.1") as c:
        r = post(c, "snapshot", {"prompt": "once upon", "name": "logits"})
        assert r.status_code == 400 and "--max-cells" in r.json()["error"]
        r = post(c, "snapshot", {"prompt": "once upon", "name": "attn.softmax", "layer": 0, "head": 0, "step": 3})
        assert r.status_code == 400 and "--max-new-tokens" in r.json()["error"]
        assert post(c, "snapshot", {"prompt": "once upon", "name": "attn.softmax", "layer": 0, "head": 0,
                                    "step": 2}).status_code == 200
        r = post(c, "tokens", {"prompt": "once upon a time the little dog ran and sat"})
        assert r.status_code == 400 and "at most 8" in r.json()["error"]
    # The prompt limit can never exceed the context (minus one new token).
    assert Inspector(model, tokenizer, Limits(max_prompt_tokens=10_000)).limits.max_prompt_tokens == 511
    with pytest.raises(ValueError, match="max_cells"):
        Limits(max_cells=0)


def test_server_serves_only_its_assets(client):
    from glassllm.inspector.assets import SCRIPTS

    for path in ["/", "/style.css", *("/" + name for name in SCRIPTS)]:
        r = client.get(path)
        assert r.status_code == 200 and "default-src 'none'" in r.headers["content-security-policy"]
    for path in ["/index.html", "/static/js/main.js", "/js/", "/js", "/app.js", "/../pyproject.toml",
                 "/%2e%2e/%2e%2e/etc/passwd",
                 "/docs", "/redoc", "/openapi.json", "/api/", "/api/snapshot/../../x", "/assets/tinystories.safetensors"]:
        r = client.get(path)
        assert r.status_code == 404 and "error" in r.json(), path
    r = client.get("/api/snapshot")
    assert r.status_code == 405 and "not allowed" in r.json()["error"]
    r = client.get("/", headers={"Host": "evil.example:80"})
    assert r.status_code == 403 and "not this server's name" in r.json()["error"]
    assert client.get("/", headers={"Host": "localhost:8765"}).status_code == 200
    r = client.post("/api/tokens", content=b"{" + b" " * 300_000 + b"}", headers={"Content-Type": "application/json"})
    assert r.status_code == 413 and "too large" in r.json()["error"]


def test_a_body_shorter_than_its_content_length_gets_408_not_a_hung_connection(inspector, monkeypatch):
    """A real socket: the client declares 100 bytes and sends 10; the server answers once BODY_TIMEOUT_S passes."""
    import socket

    from glassllm.inspector import server as srv

    monkeypatch.setattr(srv, "BODY_TIMEOUT_S", 0.5)
    s = srv.Server(create_app(inspector, prompt=PROMPT), "127.0.0.1", 0).start()
    try:
        with socket.create_connection(("127.0.0.1", s.port), timeout=10) as c:
            c.sendall(b"POST /api/tokens HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                      b"Content-Length: 100\r\n\r\n{\"prompt\":")
            answer = c.recv(65536).decode()              # raises socket.timeout if the server never answers
            while True:                                  # headers and body may come in several writes
                head, _, body = answer.partition("\r\n\r\n")
                length = re.search(r"(?im)^content-length:\s*(\d+)", head)
                if _ and length and len(body.encode()) >= int(length.group(1)):
                    break
                more = c.recv(65536).decode()
                if not more:
                    break
                answer += more
        assert answer.startswith("HTTP/1.1 408"), answer[:200]
        assert json.loads(answer.split("\r\n\r\n", 1)[1])["error"].startswith("request body incomplete: 100 bytes")
        r = TestClient(create_app(inspector), base_url="http://127.0.0.1").post("/api/tokens", json={"prompt": "hi"})
        assert r.status_code == 200                      # and a whole body is still read as before
    finally:
        s.stop()


def test_a_client_leaving_mid_body_is_one_log_line_not_a_traceback(inspector, caplog):
    """A real socket: the client declares 100 bytes, sends 10 and closes; the server logs one line, raises nothing."""
    import logging
    import socket
    import time

    from glassllm.inspector import server as srv

    s = srv.Server(create_app(inspector, prompt=PROMPT), "127.0.0.1", 0).start()
    try:
        with caplog.at_level(logging.INFO):
            with socket.create_connection(("127.0.0.1", s.port), timeout=10) as c:
                c.sendall(b"POST /api/tokens HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                          b"Content-Length: 100\r\n\r\n{\"prompt\":")
                c.shutdown(socket.SHUT_WR)
                c.recv(65536)                                # the server may answer or just close
            deadline = time.monotonic() + 5
            while not any("left before sending" in r.getMessage() for r in caplog.records):
                assert time.monotonic() < deadline, [r.getMessage() for r in caplog.records]
                time.sleep(0.05)
        assert not [r for r in caplog.records if r.exc_info or r.levelno >= logging.ERROR]
        r = TestClient(create_app(inspector), base_url="http://127.0.0.1").post("/api/tokens", json={"prompt": "hi"})
        assert r.status_code == 200
    finally:
        s.stop()


def test_random_bodies_never_give_500(client):
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    scalars = st.one_of(st.none(), st.booleans(), st.integers(-3, 1100), st.floats(allow_nan=True),
                        st.sampled_from(["", "a", "once upon", "attn.softmax", "logits", "ablate", "mask_off"]))
    field = st.sampled_from(["prompt", "name", "layer", "head", "step", "grad", "target", "temperature",
                             "top_k", "top_p", "intervention", "kind", "x"])
    body = st.dictionaries(field, st.one_of(scalars, st.dictionaries(field, scalars, max_size=3)), max_size=6)

    @hypothesis.settings(max_examples=120, deadline=None, derandomize=True)
    @hypothesis.given(kind=st.sampled_from(["tokens", "snapshot", "next"]), body=body)
    def check(kind, body):
        r = client.post(f"/api/{kind}", content=json.dumps(body), headers={"Content-Type": "application/json"})
        assert r.status_code in (200, 400), (kind, body, r.text)
        if r.status_code == 400:
            assert "\n" not in r.json()["error"]

    check()


# ----------------------------------------------------------------------------
# The offline export and the command line
# ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def small_model(parts):
    """A narrower, shorter model than the others, for the export (which runs every intervention) and the CLI."""
    config = ModelConfig(dim=32, n_layers=3, ffn_dim=64, max_seq_len=320)
    return randomize(Transformer(config, seed=3, dtype=np.float32), np.random.default_rng(4))


def test_export_embeds_the_servers_answers_and_fetches_nothing(parts, small_model, tmp_path):
    inspector = Inspector(small_model, parts[1], Limits(max_prompt_tokens=32, max_new_tokens=4))
    client = TestClient(create_app(inspector), base_url="http://127.0.0.1")
    path = tmp_path / "page.html"
    stats = export_html(inspector, PROMPT, path, steps=2)
    html = path.read_text(encoding="utf-8")
    assert stats["bytes"] == len(html.encode("utf-8"))
    # Nothing refers to the network; the CSP forbids it anyway.
    assert not re.search(r"""(src|href)\s*=\s*["'](?!data:)""", html.replace('href="data:,"', ""))
    assert "connect-src 'none'" in html and "http://" not in html and "https://" not in html
    data = json.loads(re.search(r'<script id="glass-data" type="application/json">(.*?)</script>', html, re.S)
                      .group(1))
    assert data["prompt"] == PROMPT
    responses = data["responses"]
    # The page's key for layer 2, head 3, attn.softmax holds what the server answers.
    key = request_key("snapshot", SnapshotRequest(prompt=PROMPT, name="attn.softmax", layer=2, head=3))
    assert key == 'snapshot:{"head":3,"layer":2,"name":"attn.softmax","prompt":"%s"}' % PROMPT
    live = post(client, "snapshot", {"prompt": PROMPT, "name": "attn.softmax", "layer": 2, "head": 3}).json()
    assert responses[key] == live
    kinds = {k.split(":", 1)[0] for k in responses}
    assert kinds == {"tokens", "snapshot", "next", "heads", "lens", "attribution"}
    for kind, body in (("lens", {"prompt": PROMPT}), ("attribution", {"prompt": PROMPT})):
        assert responses[f'{kind}:{{"prompt":"{PROMPT}"}}'] == post(client, kind, body).json()
    steps = {json.loads(k.split(":", 1)[1]).get("step", 0) for k in responses if k.startswith("next:")}
    assert steps == {0, 1, 2}
    assert responses['snapshot:{"grad":true,"layer":0,"name":"attn.mask","prompt":"%s"}' % PROMPT]["error"]
    with pytest.raises(ValueError, match="prompt is empty"):
        export_html(inspector, "", tmp_path / "empty.html")
    assert not (tmp_path / "empty.html").exists()


def test_the_export_draws_the_head_grid_from_float16_and_prints_every_number_exactly(parts, small_model, tmp_path):
    """Every embedded answer equals the live server's: exactly (float32), except the head grid's weights,
    which the page only draws (on 256 colour levels of the fixed scale 0 ... 1) and the export holds as
    float16: the same numbers rounded to float16, the same colour level to within one. The file is smaller
    by exactly the bytes those arrays save, about half of them."""
    from glassllm.inspector.export import render_html

    inspector = Inspector(small_model, parts[1], Limits(max_prompt_tokens=32, max_new_tokens=4))
    client = TestClient(create_app(inspector), base_url="http://127.0.0.1")
    path = tmp_path / "page.html"
    stats = export_html(inspector, PROMPT, path, steps=1)
    html = path.read_text(encoding="utf-8")
    data = json.loads(re.search(r'<script id="glass-data" type="application/json">(.*?)</script>', html, re.S)
                      .group(1))
    as_float32 = {}                     # the same page with the server's float32 grids
    halved = saved = whole = 0
    for n, (key, answer) in enumerate(data["responses"].items()):
        kind, body = key.split(":", 1)
        body = json.loads(body)
        if kind == "snapshot" and n % 7:  # a seventh of the snapshots (all kinds of them), every other answer
            as_float32[key] = answer
            continue
        live = post(client, kind, body).json()
        if kind == "next":              # the page filters the logits itself (export.build_responses)
            for part in (live, live.get("after") or {}):
                part.pop("sampled", None)
                part.pop("survivors", None)
        as_float32[key] = live
        if kind == "heads" and not body.get("grad"):
            got, want = decode_array(answer["values"]), decode_array(live["values"])
            assert answer["values"]["dtype"] == "float16" and live["values"]["dtype"] == "float32"
            np.testing.assert_array_equal(got, want.astype(np.float16))
            assert np.abs(got.astype(np.float64) - want).max() <= 2.0 ** -12
            assert np.abs(np.round(got * 255.0) - np.round(want * 255.0)).max() <= 1
            assert {k: v for k, v in answer.items() if k != "values"} == {k: v for k, v in live.items()
                                                                         if k != "values"}
            halved += 1
            saved += len(live["values"]["b64"]) - len(answer["values"]["b64"])
            whole += len(live["values"]["b64"])
        else:
            assert answer == live, key
    H = small_model.config.n_heads
    assert halved == 1 + small_model.config.n_layers * H   # the prompt's grid and each head's ablation
    assert abs(saved - whole / 2) <= 4 * halved             # base64 of half the bytes: half the characters
    page_float32 = render_html(inspector.info(), PROMPT, as_float32, None).encode("utf-8")
    assert len(page_float32) - stats["bytes"] == saved


@pytest.fixture(scope="module")
def model_file(parts, small_model, tmp_path_factory):
    from glassllm.checkpoint import save_model

    path = tmp_path_factory.mktemp("inspect") / "model.safetensors"
    save_model(path, small_model, parts[1])
    return path


def parts_tokenizer(model_file):
    from glassllm.checkpoint import load_model

    return load_model(model_file)[1]


def test_cli_html_and_bad_arguments(model_file, tmp_path, capsys):
    from glassllm.cli import main

    out = tmp_path / "story.html"
    assert main(["inspect", "once upon a time", "--model", str(model_file), "--html", str(out), "--steps", "1"]) == 0
    written = capsys.readouterr()
    assert out.stat().st_size > 10_000 and "wrote" in written.out and written.err == ""
    # Views larger than --max-cells are saved as their error: the command says how many.
    assert main(["inspect", "once upon a time", "--model", str(model_file), "--html", str(out), "--steps", "1",
                 "--max-cells", "10"]) == 0
    err = capsys.readouterr().err
    assert "views hold more than --max-cells 10 values" in err and err.count("\n") == 1
    # More steps than the model's context has room for: the command says how many the file holds.
    from glassllm.checkpoint import save_model

    short = tmp_path / "short.safetensors"
    save_model(short, randomize(Transformer(ModelConfig(dim=32, n_layers=1, ffn_dim=64, max_seq_len=16), seed=5),
                                np.random.default_rng(6)), parts_tokenizer(model_file))
    n = len(parts_tokenizer(model_file).encode_prompt("once upon a time"))
    assert main(["inspect", "once upon a time", "--model", str(short), "--html", str(out), "--steps", "6"]) == 0
    assert capsys.readouterr().err == (f"note: the context of 16 positions has room for {16 - n - 1} decoding step(s) "
                                       f"after this {n}-token prompt, not 6: the file holds those\n")
    for argv, message in [
        (["inspect", "", "--model", str(model_file), "--html", str(out)], "prompt is empty"),
        (["inspect", "x", "--model", str(model_file), "--html", str(out), "--steps", "3", "--max-new-tokens", "2"],
         "--steps must be in [0, 2] (at most --max-new-tokens), got 3"),
        (["inspect", "x", "--model", str(tmp_path / "missing.safetensors")], "does not exist"),
        (["inspect", "x", "--model", str(model_file), "--port", "70000"], "--port"),
        (["inspect", "x", "--model", str(model_file), "--max-cells", "0"], "--max-cells"),
        (["inspect", "once " * 300, "--model", str(model_file), "--html", str(out)], "at most 256"),
        (["inspect", "x", "--model", str(model_file), "--html", str(tmp_path / "no" / "dir.html")], "does not exist"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and err.count("\n") == 1, err


def test_export_holds_the_chosen_layers_and_refuses_past_its_bound(model_file, small_model, parts, tmp_path, capsys):
    from glassllm.cli import main

    whole, some = tmp_path / "whole.html", tmp_path / "some.html"
    assert main(["inspect", "once upon a time", "--model", str(model_file), "--html", str(whole), "--steps", "1"]) == 0
    capsys.readouterr()
    assert main(["inspect", "once upon a time", "--model", str(model_file), "--html", str(some), "--steps", "1",
                 "--html-layers", "1"]) == 0
    err = capsys.readouterr().err
    assert "holds the views of layers 1 of 0..2" in err and "--html-layers" in err
    assert some.stat().st_size < 0.6 * whole.stat().st_size

    def data(path):
        html = path.read_text(encoding="utf-8")
        return json.loads(re.search(r'<script id="glass-data" type="application/json">(.*?)</script>', html, re.S)
                          .group(1))
    page = data(some)
    layers = {json.loads(k.split(":", 1)[1]).get("layer") for k in page["responses"] if k.startswith("snapshot:")}
    assert layers == {None, 1}
    assert "layers 1 of 0..2" in page["left_out"] and data(whole)["left_out"] is None
    heads = [k for k in page["responses"] if k.startswith("heads:")]
    grid = page["responses"][heads[0]]
    assert grid["layers"] == 3                                          # the head grid covers every layer

    # Past the bound: one line, exit 2, nothing written; the size counted is what the page would embed.
    bounded = tmp_path / "bounded.html"
    mb = whole.stat().st_size / 1e6
    assert main(["inspect", "once upon a time", "--model", str(model_file), "--html", str(bounded), "--steps", "1",
                 "--html-max-mb", f"{mb / 3:.3f}"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err and not bounded.exists()
    assert f"passes its bound of {float(f'{mb / 3:.3f}'):g} MB (--html-max-mb)" in err
    assert "--html-layers 0,2" in err
    # A bound the model-wide views (every export's) pass alone: fewer layers would not help, so none are offered.
    assert main(["inspect", "once upon a time", "--model", str(model_file), "--html", str(bounded), "--steps", "1",
                 "--html-max-mb", "0.001", "--html-layers", "0,1"]) == 2
    err = capsys.readouterr().err
    assert "at the model-wide views" in err and "--html-layers" not in err and "raise --html-max-mb" in err
    for argv, message in [(["--html-layers", "3"], "layers (--html-layers) must be layer numbers in 0..2"),
                          (["--html-layers", "a"], "--html-layers must be layer numbers"),
                          (["--html-max-mb", "0"], "--html-max-mb must be a number of MB > 0")]:
        assert main(["inspect", "x", "--model", str(model_file), "--html", str(bounded), *argv]) == 2, argv
        err = capsys.readouterr().err
        assert message in err and err.count("\n") == 1, err
    assert main(["inspect", "x", "--model", str(model_file), "--html-layers", "0"]) == 2
    assert "--html-layers applies only with --html" in capsys.readouterr().err


@pytest.mark.parametrize("host", ["127.0.0.1", "0.0.0.0"])
def test_cli_serves_prints_the_url_and_needs_a_token_off_loopback(model_file, host):
    import httpx

    proc = subprocess.Popen(
        [sys.executable, "-m", "glassllm.cli", "inspect", "once upon a time", "--model", str(model_file),
         "--host", host, "--port", "0", "--no-browser"],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        match = re.search(r"(http://127\.0\.0\.1:\d+/)(\?token=([A-Za-z0-9_-]+))?", line)
        assert match, (line, proc.stderr.read() if proc.poll() is not None else "")
        url, token = match.group(1), match.group(3)
        assert (token is None) == (host == "127.0.0.1"), line
        headers = {"Authorization": f"Bearer {token}"} if token else {}
        info = httpx.get(url + "api/info", headers=headers, timeout=30).json()
        assert info["prompt"] == "once upon a time" and info["model"]["n_layers"] == 3
        with httpx.Client(timeout=30, follow_redirects=True) as browser:      # keeps the cookie, as a browser does
            assert browser.get(url + (f"?token={token}" if token else "")).text.startswith("<!doctype html>")
            assert browser.get(url + "api/info").status_code == 200
        if token:
            assert httpx.get(url + "api/info", timeout=30).status_code == 401
    finally:
        proc.terminate()
        _, err = proc.communicate(timeout=30)
    assert "warning" not in err.lower(), err


def test_transformer_lens_hook_names_ask_for_the_same_snapshots(client, parts):
    ours = post(client, "snapshot", {"prompt": PROMPT, "name": "attn.softmax", "layer": 2, "head": 3}).json()
    for body in ({"name": "blocks.2.attn.hook_pattern", "head": 3}, {"name": "attn.hook_pattern", "layer": 2, "head": 3},
                 {"name": "pattern", "layer": 2, "head": 3}):
        r = post(client, "snapshot", {"prompt": PROMPT, **body})
        assert r.status_code == 200, r.text
        theirs = r.json()
        assert (theirs["name"], theirs["local"], theirs["layer"]) == ("layers.2.attn.softmax", "attn.softmax", 2)
        np.testing.assert_array_equal(decode_array(theirs["values"]), decode_array(ours["values"]))
    edit = {"kind": "edit", "layer": 1, "row": 2, "col": 5, "value": 2.5}
    a = post(client, "next", {"prompt": PROMPT, "intervention": {**edit, "name": "resid_mid"}}).json()
    b = post(client, "next", {"prompt": PROMPT, "intervention": {**edit, "name": "hook_resid_mid"}}).json()
    np.testing.assert_array_equal(decode_array(a["after"]["logits"]), decode_array(b["after"]["logits"]))
    r = post(client, "snapshot", {"prompt": PROMPT, "name": "blocks.2.attn.hook_pattern", "layer": 1, "head": 0})
    assert r.status_code == 400 and "is in layer 2, but layer is 1" in r.json()["error"]


def test_the_header_counts_the_steps_of_every_training_stage():
    """The model's training steps as its file records them: a run continued from another (the bundled
    model's second stage) also names the steps of the run it started from."""
    from glassllm.checkpoint import load_bundled

    model, tokenizer, meta = load_bundled()
    info = Inspector(model, tokenizer, meta=meta).info()
    assert info["meta"]["step"] == meta["step"]
    assert info["meta"]["steps_before"] == str(json.loads(meta["base"])["steps"])
    plain = Inspector(model, tokenizer, meta={k: v for k, v in meta.items() if k != "base"}).info()
    assert "steps_before" not in plain["meta"]
    nested = Inspector(model, tokenizer, meta={**meta, "base": "[" * 100_000}).info()   # a bad field: left out
    assert "steps_before" not in nested["meta"]


def test_the_default_cache_keeps_a_pass_and_its_intervened_twin(parts):
    """A view under an intervention reads the plain pass and the intervened one: the default cache holds
    three passes of the longest prompt, so switching between them computes each once; a cache of less
    than two computes them again at every switch."""
    from glassllm.inspector.data import default_cache_mb
    from glassllm.inspector.runs import run_bound

    model, tokenizer = parts
    n = len(tokenizer.encode_prompt(PROMPT))
    limits = Limits(max_prompt_tokens=n)                                  # PROMPT is the longest prompt
    plain = {"prompt": PROMPT, "name": "attn.softmax", "layer": 1, "head": 0}
    ablated = {**plain, "intervention": {"kind": "ablate", "layer": 0, "head": 1}}
    mb = default_cache_mb(model, limits, least=0)
    assert mb * 2**20 == pytest.approx(3 * run_bound(model, n))
    roomy = Inspector(model, tokenizer, limits, cache_mb=mb)
    tight_bytes = 3 * run_bound(model, n, 4)                              # a pass keeps a quarter of it in blocks
    assert run_bound(model, n, tight_bytes) <= tight_bytes < 2 * run_bound(model, n, tight_bytes)   # one fits
    tight = Inspector(model, tokenizer, limits, cache_mb=tight_bytes / 2**20)
    for inspector in (roomy, tight):
        for body in (plain, ablated, plain, ablated, plain):
            inspector.snapshot(SnapshotRequest(**body))
        assert inspector.cache.stats()["bytes"] <= inspector.cache.max_bytes
    assert roomy.cache.stats()["computed"] == 2 and roomy.cache.stats()["evicted"] == 0
    assert tight.cache.stats()["computed"] == 5
    assert Inspector(model, tokenizer, limits).cache.max_bytes == 512 * 2**20   # a small model: at least 512 MB
