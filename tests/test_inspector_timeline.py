"""The inspector's head grid, its export of lesson 11's experiment, and the training timeline (no browser).

References: the tracer (:mod:`glassllm.trace`, itself tested against PyTorch) on the same weights, block
means computed here cell by cell, and the timeline file read back with :func:`glassllm.timeline.load_timeline`.
The timeline comes from a tiny training run made here (``glassllm train`` with ``--timeline-points``).
"""

from __future__ import annotations

import base64
import json
import re

import numpy as np
import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402
from tests.test_inspector_api import generated_text, make_model_and_tokenizer  # noqa: E402

from glassllm.inspector import Inspector, Limits, create_app, export_html  # noqa: E402
from glassllm.inspector.data import pool  # noqa: E402
from glassllm.inspector.schema import HeadsRequest, SnapshotRequest, request_key  # noqa: E402
from glassllm.trace import ZeroAblate, trace  # noqa: E402

PROMPT = "once upon a time the little dog ran"


def decode_array(enc: dict) -> np.ndarray:
    dtype = {"float16": "<f2", "float32": "<f4", "float64": "<f8", "uint8": "u1"}[enc["dtype"]]
    return np.frombuffer(base64.b64decode(enc["b64"]), dtype=dtype).reshape(enc["shape"])


def post(client, kind, body):
    return client.post(f"/api/{kind}", content=json.dumps(body), headers={"Content-Type": "application/json"})


@pytest.fixture(scope="module")
def parts():
    return make_model_and_tokenizer(np.float32)


@pytest.fixture(scope="module")
def client(parts):
    inspector = Inspector(parts[0], parts[1], Limits(max_prompt_tokens=128, max_new_tokens=4))
    return TestClient(create_app(inspector), base_url="http://127.0.0.1")


# ----------------------------------------------------------------------------
# The head grid
# ----------------------------------------------------------------------------

def test_the_head_grid_holds_every_heads_weights_and_gradients(parts, client, monkeypatch):
    from glassllm.trace import LazyTrace

    ran = []                                     # blocks a lazy trace runs again to answer a request
    monkeypatch.setattr(LazyTrace, "_segment", lambda self, seg, real=LazyTrace._segment: ran.append(seg) or
                        real(self, seg))
    model, tokenizer = parts
    ids = tokenizer.encode(PROMPT, allowed_special="all")
    n, L = len(ids), model.config.n_layers
    r = post(client, "heads", {"prompt": PROMPT}).json()
    assert (r["layers"], r["heads"], r["n"], r["block"]) == (L, model.config.n_heads, n, 1)
    future = np.triu(np.ones((n, n), bool), 1)
    ref = trace(model, np.array(ids))
    want = np.stack([ref.get("attn.softmax", layer=layer) for layer in range(L)])         # (L, H, n, n)
    np.testing.assert_array_equal(decode_array(r["values"]), np.where(future, 0, want))
    np.testing.assert_array_equal(decode_array(r["masked"]), np.broadcast_to(future, (L, n, n)))

    g = post(client, "heads", {"prompt": PROMPT, "grad": True, "target": 7}).json()
    targets = np.full(n, -100)
    targets[-1] = 7
    gref = trace(model, np.array(ids), targets=targets)
    want = np.stack([gref.grad("attn.softmax", layer=layer) for layer in range(L)])
    np.testing.assert_array_equal(decode_array(g["values"]), np.where(future, 0, want))
    assert g["target"] == 7
    assert ran == []                             # both grids read what the pass's forward and backward kept

    iv = {"kind": "ablate", "layer": 0, "head": 1}
    a = post(client, "heads", {"prompt": PROMPT, "intervention": iv}).json()
    aref = trace(model, np.array(ids), interventions=[ZeroAblate(0, 1)])
    np.testing.assert_array_equal(decode_array(a["values"])[1], np.where(future, 0, aref.get("attn.softmax", layer=1)))

    for body, message in [({"prompt": PROMPT, "target": 3}, "only used with grad true"),
                          ({"prompt": PROMPT, "grad": True, "target": 5000}, "out of range"),
                          ({"prompt": PROMPT, "intervention": {"kind": "ablate", "layer": 9, "head": 0}}, "layer=9"),
                          ({"prompt": PROMPT, "layer": 0}, "unknown field 'layer'")]:
        bad = post(client, "heads", body)
        assert bad.status_code == 400 and message in bad.json()["error"], (body, bad.text)


def test_the_head_grid_is_kept_on_its_own_bound_beyond_the_kept_blocks(parts, monkeypatch):
    """A large model's grid (every block's weights and gradients) outgrows the bytes of blocks a pass keeps;
    it has a bound of its own, so its gradients are still read without running any block again."""
    from glassllm.inspector import runs
    from glassllm.trace import LazyTrace

    model, tokenizer = parts
    n = len(tokenizer.encode(PROMPT, allowed_special="all"))
    monkeypatch.setattr(runs, "KEEP_BYTES", 1)                    # not even one block is kept
    assert not LazyTrace.grid_kept(model.config, n, runs.kept_block_bytes(512 << 20))
    inspector = Inspector(model, tokenizer, Limits(max_prompt_tokens=128, max_new_tokens=4))
    assert LazyTrace.grid_kept(model.config, n, runs.kept_grid_bytes(inspector.cache.max_bytes))
    ran = []
    monkeypatch.setattr(LazyTrace, "_segment", lambda self, seg, real=LazyTrace._segment: ran.append(seg) or
                        real(self, seg))
    app = TestClient(create_app(inspector), base_url="http://127.0.0.1")
    g = post(app, "heads", {"prompt": PROMPT, "grad": True, "target": 7}).json()
    targets = np.full(n, -100)
    targets[-1] = 7
    gref = trace(model, np.array(tokenizer.encode(PROMPT, allowed_special="all")), targets=targets)
    want = np.stack([gref.grad("attn.softmax", layer=layer) for layer in range(model.config.n_layers)])
    np.testing.assert_array_equal(decode_array(g["values"]), np.where(np.triu(np.ones((n, n), bool), 1), 0, want))
    assert ran == []
    assert inspector.cache.stats()["bytes"] <= runs.run_bound(model, 128, inspector.cache.max_bytes)


def test_a_long_prompts_thumbnails_are_block_means_of_the_allowed_cells(parts, client):
    model, tokenizer = parts
    prompt = " ".join(["once upon a time the little dog ran and the cat sat"] * 4)
    ids = tokenizer.encode(prompt, allowed_special="all")
    n = len(ids)
    assert 64 < n <= 128
    r = post(client, "heads", {"prompt": prompt}).json()
    f = -(-n // 64)
    k = -(-n // f)
    assert r["block"] == f and r["values"]["shape"] == [model.config.n_layers, model.config.n_heads, k, k]
    got = decode_array(r["values"])
    w = trace(model, np.array(ids)).get("attn.softmax", layer=2, head=3)                  # (n, n)
    for bi, bj in [(0, 0), (k - 1, 0), (k - 1, k - 1), (k // 2, k // 3), (3, 5)]:
        cells = [w[i, j] for i in range(bi * f, min(n, bi * f + f)) for j in range(bj * f, min(n, bj * f + f)) if j <= i]
        assert got[2, 3, bi, bj] == pytest.approx(np.mean(cells) if cells else 0.0, rel=1e-6, abs=1e-9)
    masked = decode_array(r["masked"])[2]
    assert masked[3, 5] and not masked[5, 3]


def test_pool_keeps_every_cell_when_the_block_is_one():
    a = np.arange(18.0).reshape(2, 3, 3)
    mask = np.triu(np.ones((3, 3), bool), 1)
    values, blocked = pool(a, mask, 1)
    np.testing.assert_array_equal(values, np.where(mask, 0, a))
    np.testing.assert_array_equal(blocked, mask)


# ----------------------------------------------------------------------------
# The export: lesson 11's experiment, ablate a layer-0 head and look at a later layer
# ----------------------------------------------------------------------------

def test_the_export_holds_every_later_layer_under_each_layer0_ablation(tmp_path):
    from glassllm.config import ModelConfig
    from glassllm.nn import Transformer
    from glassllm.tokenizer import Tokenizer
    from tests.support.glassllm_testing import randomize

    tokenizer = Tokenizer.train([generated_text(1, words=200, length=4000)], vocab_size=300)
    model = randomize(Transformer(ModelConfig(vocab_size=300, dim=32, n_layers=3, n_heads=4, n_kv_heads=2, ffn_dim=64,
                                              max_seq_len=64), seed=1, dtype=np.float32), np.random.default_rng(2))
    inspector = Inspector(model, tokenizer, Limits(max_prompt_tokens=32, max_new_tokens=2))
    prompt = "once upon a time the cat sat"
    stats = export_html(inspector, prompt, tmp_path / "page.html", steps=1)
    html = (tmp_path / "page.html").read_text(encoding="utf-8")
    responses = json.loads(re.search(r'<script id="glass-data" type="application/json">(.*?)</script>', html, re.S)
                           .group(1))["responses"]
    ids = tokenizer.encode(prompt, allowed_special="all")
    for head in range(4):
        iv = {"kind": "ablate", "layer": 0, "head": head}
        ref = trace(model, np.array(ids), interventions=[ZeroAblate(0, head)])
        for layer in (1, 2):
            for h in range(4):
                key = request_key("snapshot", SnapshotRequest(prompt=prompt, name="attn.softmax", layer=layer, head=h,
                                                              intervention=iv))
                np.testing.assert_array_equal(decode_array(responses[key]["values"]),
                                              ref.get("attn.softmax", layer=layer, head=h))
        assert request_key("heads", HeadsRequest(prompt=prompt, intervention=iv)) in responses
    # Other layers' ablations keep to their own layer.
    later = request_key("snapshot", SnapshotRequest(prompt=prompt, name="attn.softmax", layer=2, head=0,
                                                    intervention={"kind": "ablate", "layer": 1, "head": 0}))
    assert later not in responses
    assert {"tokens", "next", "snapshot", "heads", "ablation"} <= set(stats["parts"])
    assert 0 < stats["parts"]["ablation"] < stats["parts"]["snapshot"] and stats["bytes"] > sum(stats["parts"].values())


# ----------------------------------------------------------------------------
# The training timeline: a tiny run, played back
# ----------------------------------------------------------------------------

def tiny_run(folder) -> None:
    """A 24-step run of a 2-layer model with a timeline of about 8 points (a few seconds)."""
    from glassllm.cli import main

    folder.mkdir(parents=True, exist_ok=True)
    (folder / "train.txt").write_text(generated_text(2, words=200, length=6000), encoding="utf-8")
    (folder / "valid.txt").write_text(generated_text(3, words=200, length=800), encoding="utf-8")
    argv = ["train", "--data", str(folder / "train.txt"), "--valid", str(folder / "valid.txt"),
            "--out", str(folder / "run"), "--steps", "24", "--batch-size", "4", "--seq-len", "32",
            "--warmup-steps", "2", "--lr", "0.01", "--eval-every", "8", "--eval-windows", "4", "--vocab-size", "300",
            "--dim", "32", "--n-layers", "2", "--n-heads", "4", "--n-kv-heads", "2", "--no-progress",
            "--timeline-points", "8", "--threads", "1"]
    assert main(argv) == 0


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    folder = tmp_path_factory.mktemp("timeline")
    tiny_run(folder)
    return folder / "run"


def test_the_timeline_answer_is_the_runs_file(run):
    from glassllm.checkpoint import load_model
    from glassllm.commands.inspect import load_inspected
    from glassllm.timeline import load_timeline

    model, tokenizer, meta, timeline = load_inspected(None, str(run))
    assert timeline is not None
    inspector = Inspector(model, tokenizer, timeline=timeline)
    client = TestClient(create_app(inspector, tab="training"), base_url="http://127.0.0.1")
    info = client.get("/api/info").json()
    want = load_timeline(run)
    assert info["tab"] == "training" and info["timeline"] == {"steps": len(want.steps), "last": want.steps[-1],
                                                              "tokens": len(want.ids)}
    r = post(client, "timeline", {}).json()
    assert r["steps"] == want.steps and r["steps"][0] == 0 and r["period"] == want.period and r["rows"] == want.rows
    np.testing.assert_array_equal(decode_array(r["attn"]), want.attn)                     # float16, as stored
    np.testing.assert_array_equal(decode_array(r["probs"]), want.probs)
    np.testing.assert_array_equal(decode_array(r["induction"]), want.induction)
    # The last recorded step's weights are the saved model's own, on the probe.
    last = trace(load_model(run / "model.safetensors")[0], np.array(want.ids))
    got = decode_array(r["attn"])[-1].astype(np.float32)
    np.testing.assert_allclose(got[1, 2], last.get("attn.softmax", layer=1, head=2), atol=1e-3)
    assert post(client, "timeline", {"x": 1}).status_code == 400

    # Without a timeline the route says so in one line.
    plain = TestClient(create_app(Inspector(model, tokenizer)), base_url="http://127.0.0.1")
    bad = post(plain, "timeline", {})
    assert bad.status_code == 400 and "no training timeline" in bad.json()["error"]
    assert plain.get("/api/info").json()["timeline"] is None


def test_inspect_run_refuses_what_is_not_a_run(run, tmp_path, capsys):
    from glassllm.cli import main

    (tmp_path / "empty").mkdir()
    for argv, message in [
        (["inspect", "--run", str(tmp_path / "nowhere")], "is not a folder"),
        (["inspect", "--run", str(tmp_path / "empty")], "holds no model.safetensors"),
        (["inspect", "--run", str(run), "--model", str(run / "model.safetensors")], "not both"),
    ]:
        assert main(argv) == 2, argv
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err and err.count("\n") == 1, err
    (tmp_path / "no-timeline").mkdir()
    (tmp_path / "no-timeline" / "model.safetensors").write_bytes((run / "model.safetensors").read_bytes())
    assert main(["inspect", "--run", str(tmp_path / "no-timeline")]) == 2
    assert "no timeline.safetensors" in capsys.readouterr().err


def test_a_model_file_with_a_timeline_beside_it_gets_the_training_tab(run, tmp_path):
    import shutil

    from glassllm.commands.inspect import load_inspected

    shutil.copy(run / "model.safetensors", tmp_path / "m.safetensors")
    assert load_inspected(str(tmp_path / "m.safetensors"))[3] is None
    shutil.copy(run / "timeline.safetensors", tmp_path / "m.timeline.safetensors")
    model, tokenizer, meta, timeline = load_inspected(str(tmp_path / "m.safetensors"))
    assert timeline is not None and timeline.steps[0] == 0
    out = tmp_path / "page.html"
    export_html(Inspector(model, tokenizer, Limits(max_prompt_tokens=16, max_new_tokens=1), timeline=timeline),
                "the cat", out, steps=0)
    assert '"timeline:{}"' in out.read_text(encoding="utf-8")
