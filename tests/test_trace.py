"""The tracer (glassllm.trace) against independent references.

- The registry equals what a full trace records, and every shape equals the
  hand-written legend (default config, with and without a KV cache).
- Every snapshot is recomputed in plain NumPy (float64) from the snapshots
  before it: the rotation, the scaled scores, the mask, the softmax, the value
  mix, W_O, the norms, the MLP, the logits.
- A cached generation's snapshots equal the matching rows of one uncached forward.
- Gradients equal central finite differences (taken by editing the snapshot
  itself) and PyTorch's gradients of the same intermediate tensors
  (tests/torch_reference.py).
- Interventions equal hand recomputations; the mask and temperature experiments.
- Export round trips; a malformed trace file is refused with one ValueError.
"""

from __future__ import annotations

import json
import math
import tempfile
import zipfile
from pathlib import Path

import numpy as np
import pytest

from tests.support.glassllm_testing import TINY, randomize
from glassllm import autograd as ag
from glassllm import trace as tr
from glassllm.config import ModelConfig
from glassllm.nn import Transformer
from glassllm.trace import (Edit, MaskOff, MeanAblate, Patch, Temperature, Tracer, ZeroAblate, load_trace,
                            registry, trace)

DEFAULT = ModelConfig()
DOC = Path(__file__).resolve().parents[1] / "docs" / "snapshots.md"

# The shape legend, written out by hand for the default config (n, m vary).
LEGEND = {"H": 4, "G": 2, "D": 32, "C": 128, "V": 1024, "F": 352}

# The default config's snapshot shapes, by local name (batch removed), from the spec and the docs.
EXPECTED = {
    "embed": ("n", 128), "resid_pre": ("n", 128), "resid_mid": ("n", 128), "resid_post": ("n", 128),
    "attn_norm.in": ("n", 128), "attn_norm.rms": ("n",), "attn_norm.out": ("n", 128),
    "mlp_norm.in": ("n", 128), "mlp_norm.rms": ("n",), "mlp_norm.out": ("n", 128),
    "attn.q": (4, "n", 32), "attn.k": (2, "n", 32), "attn.v": (2, "n", 32),
    "attn.rope_q": (4, "n", 32), "attn.rope_k": (2, "n", 32),
    "attn.cache_k": (2, "m", 32), "attn.cache_v": (2, "m", 32),
    "attn.scores": (4, "n", "m"), "attn.mask": ("n", "m"), "attn.softmax": (4, "n", "m"),
    "attn.mix": (4, "n", 32), "attn.head_out": (4, "n", 128), "attn.out": ("n", 128),
    "mlp.gate": ("n", 352), "mlp.up": ("n", 352), "mlp.act": ("n", 352), "mlp.prod": ("n", 352),
    "mlp.out": ("n", 128),
    "norm.in": ("n", 128), "norm.rms": ("n",), "norm.out": ("n", 128), "logits": ("n", 1024), "probs": ("n", 1024),
}


def local(name: str) -> str:
    return name.split(".", 2)[2] if name.startswith("layers.") else name


def expected_shape(name: str, n: int, m: int) -> tuple:
    return tuple({"n": n, "m": m}.get(s, s) for s in EXPECTED[local(name)])


@pytest.fixture(scope="module")
def default_model():
    model = Transformer(DEFAULT, seed=0, dtype=np.float64)
    return randomize(model, np.random.default_rng(7))


@pytest.fixture(scope="module")
def tiny_model():
    return randomize(Transformer(TINY, seed=0, dtype=np.float64), np.random.default_rng(3))


def tokens_for(config, n, seed=0):
    return np.random.default_rng(seed).integers(0, config.vocab_size, size=n)


# ----------------------------------------------------------------------------
# Plain NumPy reference pieces (float64), written from the math, not from glassllm.nn
# ----------------------------------------------------------------------------

def np_rope(x, positions, theta):
    """Rotate interleaved pairs by pos * theta^(-2i/D), as complex numbers: (..., n, D)."""
    D = x.shape[-1]
    z = x[..., 0::2] + 1j * x[..., 1::2]                                 # (..., n, D/2)
    angle = np.asarray(positions)[:, None] * theta ** (-np.arange(0, D, 2) / D)
    z = z * np.exp(1j * angle)
    out = np.empty(x.shape)
    out[..., 0::2], out[..., 1::2] = z.real, z.imag
    return out


def np_softmax_masked(scores, mask):
    s = np.where(mask, -np.inf, scores)
    e = np.exp(s - s.max(axis=-1, keepdims=True))
    return e / e.sum(axis=-1, keepdims=True)


def np_rmsnorm(x, w, eps):
    return x / np.sqrt((x * x).mean(-1, keepdims=True) + eps) * w


def np_silu(x):
    return x / (1 + np.exp(-x))


def weights(model):
    return {k: v.astype(np.float64) for k, v in model.state_dict().items()}


def np_layer(W, c, i, x, positions, mix_edit=None):
    """One block on x (n, C) without a cache; mix_edit(mix (H, n, D)) may change the head outputs."""
    p = f"layers.{i}."
    n, H, G, D = x.shape[0], c.n_heads, c.n_kv_heads, c.head_dim
    h = np_rmsnorm(x, W[p + "attention_norm.weight"], c.norm_eps)
    q = (h @ W[p + "attention.wq.weight"].T).reshape(n, H, D).transpose(1, 0, 2)
    k = (h @ W[p + "attention.wk.weight"].T).reshape(n, G, D).transpose(1, 0, 2)
    v = (h @ W[p + "attention.wv.weight"].T).reshape(n, G, D).transpose(1, 0, 2)
    q, k = np_rope(q, positions, c.rope_theta), np_rope(k, positions, c.rope_theta)
    k, v = np.repeat(k, H // G, axis=0), np.repeat(v, H // G, axis=0)
    a = np_softmax_masked(q @ k.transpose(0, 2, 1) / math.sqrt(D), np.triu(np.ones((n, n), bool), 1))
    mix = a @ v
    if mix_edit is not None:
        mix = mix_edit(mix)
    x = x + mix.transpose(1, 0, 2).reshape(n, H * D) @ W[p + "attention.wo.weight"].T
    h = np_rmsnorm(x, W[p + "ffn_norm.weight"], c.norm_eps)
    f = np_silu(h @ W[p + "feed_forward.w1.weight"].T) * (h @ W[p + "feed_forward.w3.weight"].T)
    return x + f @ W[p + "feed_forward.w2.weight"].T


def np_head(W, c, x):
    return np_rmsnorm(x, W["norm.weight"], c.norm_eps) @ W["output.weight"].T


# ----------------------------------------------------------------------------
# 1. The registry equals what is recorded; every shape as documented
# ----------------------------------------------------------------------------

def test_registry_is_the_module_walk_and_covers_the_issue_names():
    model = Transformer(DEFAULT, seed=0)
    reg = registry(model)
    assert reg == registry(DEFAULT) == {k: tuple(v) for k, v in registry().items()}
    assert tr.names() == list(reg) and len(set(reg)) == len(reg)
    assert {local(k) for k in reg} == set(EXPECTED)
    for i in range(4):
        for s in ("q", "k", "v", "rope_q", "rope_k", "scores", "mask", "softmax", "mix", "out"):
            assert f"layers.{i}.attn.{s}" in reg           # the spec's ten attention names, layers 0-3
    # forward order: embed first, probs last, layer 0 before layer 1
    order = list(reg)
    assert order[0] == "embed" and order[-2:] == ["logits", "probs"]
    assert order.index("layers.0.resid_post") < order.index("layers.1.resid_pre")
    for name, axes in reg.items():
        sizes = {"n": "n", "m": "m", **LEGEND}
        assert tuple(sizes[a] for a in axes) == EXPECTED[local(name)], name


def test_full_trace_records_exactly_the_registry_uncached_and_cached(default_model):
    model, reg = default_model, registry(default_model)
    with ag.no_grad(), Tracer(model) as t:
        model(tokens_for(DEFAULT, 6))
    step = t.trace.steps[0]
    assert list(step.values) == list(reg)                 # same names, same (forward) order
    for name, value in step.values.items():
        assert value.shape == expected_shape(name, 6, 6), name
        assert value.shape == tr.snapshot_shape(name, DEFAULT, 6)
    assert t.trace.get("layers.2.attn.softmax").shape == (4, 6, 6)
    assert t.trace.get("attn.softmax", layer=2, head=3).shape == (6, 6)      # a head: (n, m)
    assert t.trace.get("layers.1.attn.k").shape == (2, 6, 32)
    assert t.trace.get("attn.k", layer=1, head=1).shape == (6, 32)

    cache = model.new_cache()
    with ag.no_grad(), Tracer(model) as t:
        model(tokens_for(DEFAULT, 5), cache)
        model([[7]], cache)
        model([[9]], cache)
    assert [(s.n, s.m, s.start) for s in t.trace.steps] == [(5, 5, 0), (1, 6, 5), (1, 7, 6)]
    for s in t.trace.steps:
        assert list(s.values) == list(reg)
        for name, value in s.values.items():
            assert value.shape == expected_shape(name, s.n, s.m), (s.index, name)
    assert t.trace.get("layers.0.attn.softmax", step=2).shape == (4, 1, 7)
    assert t.trace.tokens.tolist() == tokens_for(DEFAULT, 5).tolist() + [7, 9]


def test_the_docs_command_rewrites_only_the_table(tmp_path, capsys):
    from glassllm.trace.__main__ import main

    page = tmp_path / "snapshots.md"
    text = DOC.read_text(encoding="utf-8")
    head, rest = text.split(tr.DOC_BEGIN, 1)
    page.write_text(head + tr.DOC_BEGIN + "\nstale\n" + tr.DOC_END + rest.split(tr.DOC_END, 1)[1], encoding="utf-8")
    assert main([str(page)]) == 0
    assert page.read_text(encoding="utf-8") == text
    with pytest.raises(SystemExit) as info:
        main(["--help"])
    assert info.value.code == 0 and "FILE" in capsys.readouterr().out
    assert main([str(tmp_path / "missing.md")]) == 2
    assert "missing.md" in capsys.readouterr().err


def test_the_docs_table_matches_the_registry():
    text = DOC.read_text(encoding="utf-8")
    block = text.split(tr.DOC_BEGIN, 1)[1].split(tr.DOC_END, 1)[0]
    assert block.strip() == tr.snapshot_table().strip(), "regenerate: python -m glassllm.trace docs/snapshots.md"
    rows = [r for r in block.strip().splitlines()[2:]]
    generic = {r.split("`")[1] for r in rows}
    assert generic == {("layers.{i}." + local(k)) if k.startswith("layers.") else k for k in registry()}


@pytest.mark.parametrize("module", ["", ".registry", ".record", ".tracer", ".interventions", ".files"])
def test_module_examples_run(module):
    import doctest
    import importlib

    assert doctest.testmod(importlib.import_module("glassllm.trace" + module)).failed == 0


# ----------------------------------------------------------------------------
# 2. Recomputation of every snapshot from the one before it
# ----------------------------------------------------------------------------

def check_attention_chain(t, W, c, step=None):
    """Recompute each attention snapshot of every layer from the previous one (plain NumPy)."""
    s = t.step(step)
    H, G, D = c.n_heads, c.n_kv_heads, c.head_dim
    positions = np.arange(s.start, s.m)
    for i in range(c.n_layers):
        g = lambda name: t.get(f"layers.{i}.attn.{name}", step=step)   # noqa: E731
        x = t.get(f"layers.{i}.attn_norm.out", step=step)
        np.testing.assert_allclose(g("q"), (x @ W[f"layers.{i}.attention.wq.weight"].T)
                                   .reshape(s.n, H, D).transpose(1, 0, 2), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(g("v"), (x @ W[f"layers.{i}.attention.wv.weight"].T)
                                   .reshape(s.n, G, D).transpose(1, 0, 2), rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(g("rope_q"), np_rope(g("q"), positions, c.rope_theta), atol=1e-12)
        np.testing.assert_allclose(g("rope_k"), np_rope(g("k"), positions, c.rope_theta), atol=1e-12)
        # the new keys/values are the last n of the m the queries read
        np.testing.assert_array_equal(g("cache_k")[:, s.start:], g("rope_k"))
        np.testing.assert_array_equal(g("cache_v")[:, s.start:], g("v"))
        keys = np.repeat(g("cache_k"), H // G, axis=0)                  # (H, m, D)
        vals = np.repeat(g("cache_v"), H // G, axis=0)                  # (H, m, D)
        np.testing.assert_allclose(g("scores"), g("rope_q") @ keys.transpose(0, 2, 1) / math.sqrt(D), atol=1e-12)
        mask = g("mask")
        np.testing.assert_array_equal(mask, np.arange(s.m)[None, :] > (s.start + np.arange(s.n))[:, None])
        a = g("softmax")
        np.testing.assert_allclose(a, np_softmax_masked(g("scores"), mask), atol=1e-12)
        assert np.all(np.abs(a.sum(-1) - 1) < 1e-6)
        assert np.all(a[:, mask] == 0.0)                               # exactly zero, not small
        np.testing.assert_allclose(g("mix"), a @ vals, atol=1e-12)
        heads = g("mix").transpose(1, 0, 2).reshape(s.n, H * D)
        np.testing.assert_allclose(g("out"), heads @ W[f"layers.{i}.attention.wo.weight"].T, atol=1e-12)


def test_recompute_every_snapshot_uncached(default_model):
    c, W = DEFAULT, weights(default_model)
    toks = tokens_for(c, 9, seed=1)
    t = trace(default_model, toks)
    assert D_is_32(c)
    check_attention_chain(t, W, c)
    np.testing.assert_array_equal(t.get("embed"), W["tok_embeddings.weight"][toks])
    for i in range(c.n_layers):
        p, g = f"layers.{i}.", (lambda name: t.get(f"layers.{i}.{name}"))   # noqa: E731
        np.testing.assert_array_equal(g("resid_pre"), t.get("embed") if i == 0 else t.get(f"layers.{i - 1}.resid_post"))
        for norm, key, src in (("attn_norm", "attention_norm", "resid_pre"), ("mlp_norm", "ffn_norm", "resid_mid")):
            x = g(src)
            np.testing.assert_array_equal(g(norm + ".in"), x)
            np.testing.assert_allclose(g(norm + ".rms"), np.sqrt((x ** 2).mean(-1) + c.norm_eps), rtol=1e-12)
            np.testing.assert_allclose(g(norm + ".out"), np_rmsnorm(x, W[p + key + ".weight"], c.norm_eps), atol=1e-12)
        np.testing.assert_allclose(g("resid_mid"), g("resid_pre") + g("attn.out"), atol=1e-12)
        h = g("mlp_norm.out")
        np.testing.assert_allclose(g("mlp.gate"), h @ W[p + "feed_forward.w1.weight"].T, atol=1e-12)
        np.testing.assert_allclose(g("mlp.up"), h @ W[p + "feed_forward.w3.weight"].T, atol=1e-12)
        np.testing.assert_allclose(g("mlp.act"), np_silu(g("mlp.gate")), atol=1e-12)
        np.testing.assert_allclose(g("mlp.prod"), g("mlp.act") * g("mlp.up"), atol=1e-12)
        np.testing.assert_allclose(g("mlp.out"), g("mlp.prod") @ W[p + "feed_forward.w2.weight"].T, atol=1e-12)
        np.testing.assert_allclose(g("resid_post"), g("resid_mid") + g("mlp.out"), atol=1e-12)
    np.testing.assert_array_equal(t.get("norm.in"), t.get("layers.3.resid_post"))
    np.testing.assert_allclose(t.get("norm.out"), np_rmsnorm(t.get("norm.in"), W["norm.weight"], c.norm_eps),
                               atol=1e-12)
    np.testing.assert_allclose(t.get("logits"), t.get("norm.out") @ W["output.weight"].T, atol=1e-11)
    np.testing.assert_allclose(t.get("probs"), np_softmax_masked(t.get("logits"), False), atol=1e-14)
    # ... and the traced logits are the model's, computed by an independent NumPy forward
    x = W["tok_embeddings.weight"][toks]
    for i in range(c.n_layers):
        x = np_layer(W, c, i, x, np.arange(len(toks)))
    np.testing.assert_allclose(t.get("logits"), np_head(W, c, x), rtol=1e-9, atol=1e-10)


def D_is_32(c):
    return c.head_dim == 32   # the spec's sqrt(32)


def test_recompute_attention_with_a_cache(default_model):
    cache = default_model.new_cache()
    with ag.no_grad(), Tracer(default_model, names=["attn.*", "layers.*.attn_norm.out"]) as t:
        default_model(tokens_for(DEFAULT, 4, seed=2), cache)
        for tok in (3, 1000, 17):
            default_model([[tok]], cache)
    for step in range(4):
        check_attention_chain(t.trace, weights(default_model), DEFAULT, step=step)


# ----------------------------------------------------------------------------
# 3. Cached generation equals one uncached forward
# ----------------------------------------------------------------------------

def rows_of(full: np.ndarray, axes: tuple, s: tr.Step) -> np.ndarray:
    index = tuple(slice(s.start, s.start + s.n) if a == "n" else slice(0, s.m) if a == "m" else slice(None)
                  for a in axes)
    return full[index]


def test_cached_generation_equals_uncached_rows(tiny_model):
    toks = tokens_for(TINY, 10, seed=4)
    full = trace(tiny_model, toks)
    cache = tiny_model.new_cache()
    with ag.no_grad(), Tracer(tiny_model) as t:
        tiny_model(toks[:4], cache)                       # prefill: n = m = 4
        for tok in toks[4:]:
            tiny_model([[tok]], cache)                    # then n = 1, m = start + 1
    steps = t.trace.steps
    assert [(s.n, s.m, s.start) for s in steps] == [(4, 4, 0)] + [(1, k + 1, k) for k in range(4, 10)]
    reg = registry(tiny_model)
    for s in steps:
        assert list(s.values) == list(reg)
        for name, value in s.values.items():
            np.testing.assert_allclose(value, rows_of(full.get(name), reg[name], s), rtol=1e-10, atol=1e-12,
                                       err_msg=f"step {s.index} {name}")
    # The keys of one step are a prefix of the next step's keys.
    for a, b in zip(steps, steps[1:]):
        for i in range(TINY.n_layers):
            for kv in ("cache_k", "cache_v"):
                name = f"layers.{i}.attn.{kv}"
                np.testing.assert_array_equal(b.values[name][:, :a.m], a.values[name])


def test_generation_under_a_tracer_records_one_step_per_forward(tiny_model):
    from glassllm.generate import generate

    prompt = tokens_for(TINY, 5, seed=24).tolist()
    with Tracer(tiny_model, names=["attn.cache_k", "logits"]) as t:
        out = [tok.id for tok in generate(tiny_model, None, prompt, max_new_tokens=4, temperature=0)]
    steps = t.trace.steps
    assert [(s.n, s.m, s.start) for s in steps] == [(5, 5, 0), (1, 6, 5), (1, 7, 6), (1, 8, 7)]
    assert t.trace.tokens.tolist() == prompt + out[:3]
    for s in steps:                                      # greedy: each step's last row picks the next id
        assert int(np.argmax(s.values["logits"][-1])) == out[s.index]
    for a, b in zip(steps, steps[1:]):
        np.testing.assert_array_equal(b.values["layers.1.attn.cache_k"][:, :a.m], a.values["layers.1.attn.cache_k"])


def test_a_rewound_cache_does_not_change_recorded_snapshots(tiny_model):
    cache = tiny_model.new_cache()
    with ag.no_grad(), Tracer(tiny_model, names="layers.0.attn.cache_k") as t:
        tiny_model(tokens_for(TINY, 5, seed=5), cache)
    kept = np.array(t.trace.get("layers.0.attn.cache_k"))
    cache.start = 0                                      # reuse the cache for another prompt
    with ag.no_grad():
        tiny_model(tokens_for(TINY, 5, seed=6), cache)
    np.testing.assert_array_equal(t.trace.get("layers.0.attn.cache_k"), kept)
    with pytest.raises(ValueError):
        t.trace.get("layers.0.attn.cache_k")[0, 0, 0] = 1.0       # stored arrays are read-only


# ----------------------------------------------------------------------------
# 4. Gradients
# ----------------------------------------------------------------------------

def loss_with_edit(model, toks, targets, name, index, eps):
    def bump(x):
        x = x.copy()
        x[index] += eps
        return x
    with ag.no_grad(), Tracer(model, names=(), interventions=[Edit(name, bump)]):
        logits = model(toks)
    return ag.cross_entropy(logits, targets[None]).item()


@pytest.mark.parametrize("name,index", [
    ("embed", (3, 5)),
    ("layers.0.attn_norm.in", (2, 7)),        # the norm's share only (resid_pre carries the residual path)
    ("layers.0.attn_norm.rms", (4,)),
    ("layers.1.attn.rope_k", (1, 2, 3)),
    ("layers.1.attn.scores", (2, 5, 1)),
    ("layers.1.attn.softmax", (3, 4, 2)),
    ("layers.0.mlp.act", (5, 11)),
    ("norm.rms", (1,)),
])
def test_gradients_match_finite_differences(tiny_model, name, index):
    toks, targets = tokens_for(TINY, 6, seed=8), tokens_for(TINY, 6, seed=9)
    t = trace(tiny_model, toks, targets=targets)
    eps = 1e-6
    numeric = (loss_with_edit(tiny_model, toks, targets, name, index, eps)
               - loss_with_edit(tiny_model, toks, targets, name, index, -eps)) / (2 * eps)
    assert t.grad(name)[index] == pytest.approx(numeric, rel=1e-6, abs=1e-9)


def test_gradients_match_pytorch_for_every_snapshot(tiny_model):
    torch = pytest.importorskip("torch")
    torch_reference = pytest.importorskip("tests.support.torch_reference")
    toks, targets = tokens_for(TINY, 7, seed=10), tokens_for(TINY, 7, seed=11)
    t = trace(tiny_model, toks, targets=targets)
    assert set(t.steps[0].grads) == set(registry(tiny_model)) - {f"layers.{i}.attn.mask" for i in range(2)}

    ref = torch_reference.TorchLlama(TINY.to_dict())
    ref.load_glassllm_state(tiny_model.state_dict())
    capture = {}
    logits = ref(toks[None], capture=capture)
    loss = torch.nn.functional.cross_entropy(logits[0], torch.as_tensor(targets))
    loss.backward()
    assert t.loss == pytest.approx(loss.item(), rel=1e-12)

    def tgrad(name):
        return capture[name].grad[0].numpy()

    checked = 0
    for name in registry(tiny_model):
        loc = local(name)
        if loc in ("attn_norm.rms", "mlp_norm.rms", "norm.rms", "attn.mask", "probs"):
            continue           # rms: finite differences above; no gradient through a mask or the probs
        if loc in ("attn.cache_k", "attn.cache_v"):
            want = tgrad(name.replace("cache_k", "rope_k").replace("cache_v", "v"))  # no cache: the same tensors
        elif loc in ("attn_norm.in", "mlp_norm.in"):
            # PyTorch's x is one tensor used twice (the norm and the residual); the name's own
            # gradient is the norm's share: total minus what arrives through the residual sum.
            i = name.split(".")[1]
            before, after = ("resid_pre", "resid_mid") if loc == "attn_norm.in" else ("resid_mid", "resid_post")
            want = tgrad(f"layers.{i}.{before}") - tgrad(f"layers.{i}.{after}")
        else:
            want = tgrad(name)
        np.testing.assert_allclose(t.grad(name), want, rtol=1e-8, atol=1e-12, err_msg=name)
        checked += 1
    assert checked == len(registry(tiny_model)) - 2 - 3 * TINY.n_layers   # all but rms, mask, probs
    np.testing.assert_array_equal(t.grad("probs"), 0.0)  # the loss is computed from the logits


def test_gradients_under_a_tracer_with_filter_and_dtype(tiny_model):
    toks, targets = tokens_for(TINY, 5), tokens_for(TINY, 5, seed=1)
    full = trace(tiny_model, toks, targets=targets)
    part = trace(tiny_model, toks, ["layers.1.attn.softmax", "mlp.act"], targets=targets, dtype="float32")
    assert part.names() == ["layers.0.mlp.act", "layers.1.attn.softmax", "layers.1.mlp.act"]
    for name in part.names():
        assert part.grad(name).dtype == np.float32
        np.testing.assert_allclose(part.grad(name), full.grad(name), rtol=1e-5, atol=1e-7)
    assert all(p.grad is None for p in tiny_model.parameters())   # trace() leaves parameter grads alone


# ----------------------------------------------------------------------------
# 5. Interventions
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("layer,head", [(0, 1), (1, 3)])
def test_zero_ablating_a_head_equals_a_hand_recomputation(tiny_model, layer, head):
    c, W = TINY, weights(tiny_model)
    toks = tokens_for(c, 8, seed=12)
    clean = trace(tiny_model, toks)
    ablated = trace(tiny_model, toks, interventions=[ZeroAblate(layer, head)])

    def zero(mix):
        mix = mix.copy()
        mix[head] = 0.0
        return mix
    x = clean.get(f"layers.{layer}.resid_pre")
    for i in range(layer, c.n_layers):
        x = np_layer(W, c, i, x, np.arange(len(toks)), zero if i == layer else None)
    np.testing.assert_allclose(ablated.get("logits"), np_head(W, c, x), rtol=1e-9, atol=1e-10)
    assert np.abs(ablated.get("logits") - clean.get("logits")).max() > 1e-3
    np.testing.assert_array_equal(ablated.get("attn.mix", layer=layer, head=head), 0.0)


def test_an_intervention_from_fields_ablates_and_edits_as_asked(tiny_model):
    from glassllm.trace.interventions import from_fields

    c, W = TINY, weights(tiny_model)
    toks = tokens_for(c, 6, seed=15)
    axes = tr.registry(tiny_model)
    clean = trace(tiny_model, toks)
    ablated = trace(tiny_model, toks, interventions=[from_fields("ablate", 1, head=2, axes=axes, config=c, n=6)])

    def zero(mix):
        mix = mix.copy()
        mix[2] = 0.0
        return mix
    x = clean.get("layers.1.resid_pre")
    for i in range(1, c.n_layers):
        x = np_layer(W, c, i, x, np.arange(len(toks)), zero if i == 1 else None)
    np.testing.assert_allclose(ablated.get("logits"), np_head(W, c, x), rtol=1e-9, atol=1e-10)

    edit = from_fields("edit", 0, name="mlp.act", row=4, col=7, value=3.5, axes=axes, config=c, n=6)
    edited = trace(tiny_model, toks, interventions=[edit]).get("layers.0.mlp.act")
    expected = clean.get("layers.0.mlp.act").copy()
    expected[4, 7] = 3.5
    np.testing.assert_array_equal(edited, expected)


@pytest.mark.parametrize("fields, message", [
    (dict(kind="ablate", layer=TINY.n_layers, head=0), f"layer={TINY.n_layers} is out of range"),
    (dict(kind="ablate", layer=0, head=-1), "head -1 must be an int >= 0"),
    (dict(kind="ablate", layer=0), "'ablate' needs a head"),
    (dict(kind="temperature", layer=0, temperature=0.0), "temperature 0.0 is out of range"),
    (dict(kind="mask_off", layer=0, head=1), "send head null"),
    (dict(kind="edit", layer=0, name="mlp.act", row=0, col=0, value=1e7), "value 10000000.0 is out of range"),
    (dict(kind="edit", layer=0, name="mlp.act", row=99, col=0, value=1.0), "cell (99, 0) is outside 'mlp.act'"),
    (dict(kind="edit", layer=0, name="attn.softmax", head=0, row=0, col=1, value=0.5), "is a future key"),
    (dict(kind="explode", layer=0), "kind 'explode' is unknown"),
])
def test_an_intervention_from_fields_refuses_bad_fields_in_one_line(tiny_model, fields, message):
    from glassllm.checks import ParameterError
    from glassllm.trace.interventions import from_fields

    with pytest.raises(ParameterError) as e:
        from_fields(**fields, axes=tr.registry(tiny_model), config=TINY, n=6)
    assert e.value.param == "intervention" and message in str(e.value) and "\n" not in str(e.value)


def test_mean_ablation_uses_the_reference_traces_mean(tiny_model):
    ref = trace(tiny_model, tokens_for(TINY, 12, seed=13), names="layers.1.attn.mix")
    mean = ref.get("attn.mix", layer=1, head=2).mean(axis=0)               # (D,)
    toks = tokens_for(TINY, 6, seed=14)
    clean = trace(tiny_model, toks)
    out = trace(tiny_model, toks, interventions=[MeanAblate(1, 2, ref)])
    mix, mix0 = out.get("layers.1.attn.mix"), clean.get("layers.1.attn.mix")
    np.testing.assert_allclose(mix[2], np.broadcast_to(mean, mix[2].shape), rtol=1e-12)
    np.testing.assert_array_equal(np.delete(mix, 2, axis=0), np.delete(mix0, 2, axis=0))
    wo = weights(tiny_model)["layers.1.attention.wo.weight"]
    np.testing.assert_allclose(out.get("layers.1.attn.out"), mix.transpose(1, 0, 2).reshape(6, -1) @ wo.T, atol=1e-12)


def test_mask_off_lets_the_future_leak_and_mask_on_does_not(tiny_model):
    a = tokens_for(TINY, 7, seed=15)
    b = a.copy()
    b[5] = (b[5] + 1) % TINY.vocab_size                   # change a later token
    with ag.no_grad():
        on = [tiny_model(x).data[0] for x in (a, b)]       # untraced, fused path
    traced_on = [trace(tiny_model, x, "logits").get("logits") for x in (a, b)]
    off = [trace(tiny_model, x, ["logits", "attn.mask", "attn.softmax"], interventions=[MaskOff()]) for x in (a, b)]
    np.testing.assert_array_equal(on[0][:5], on[1][:5])            # positions before 5 cannot see it
    np.testing.assert_array_equal(traced_on[0][:5], traced_on[1][:5])
    assert np.abs(off[0].get("logits")[0] - off[1].get("logits")[0]).max() > 1e-3   # position 0 sees it
    assert not off[0].get("layers.0.attn.mask").any()
    assert (off[0].get("layers.0.attn.softmax")[:, 0, 1:] > 0).all()


def entropy(p):
    q = np.where(p > 0, p, 1.0)
    return -(p * np.log(q)).sum(-1)


def test_temperature_flattens_every_legal_row_and_never_leaks(tiny_model):
    toks = tokens_for(TINY, 8, seed=16)
    names = ["attn.scores", "attn.softmax", "attn.mask"]
    cold = trace(tiny_model, toks, names)
    hot = trace(tiny_model, toks, names, interventions=[Temperature(4.0)])
    for i in range(TINY.n_layers):
        mask = hot.get("attn.mask", layer=i)
        a = hot.get("attn.softmax", layer=i)
        assert np.all(a[:, mask] == 0.0)                                  # never on a masked key
        np.testing.assert_allclose(a.sum(-1), 1.0, atol=1e-12)
        np.testing.assert_allclose(a, np_softmax_masked(hot.get("attn.scores", layer=i), mask), atol=1e-12)
    # Layer 0 sees the same input either way: the same scores, divided by 4.
    s0, a0, a4 = cold.get("layers.0.attn.scores"), cold.get("layers.0.attn.softmax"), hot.get("layers.0.attn.softmax")
    np.testing.assert_allclose(hot.get("layers.0.attn.scores"), s0 / 4.0, rtol=1e-15)
    np.testing.assert_array_equal(a4[:, 0], a0[:, 0])                      # one legal key: [1, 0, ...]
    assert np.all(entropy(a4[:, 1:]) > entropy(a0[:, 1:]))                  # every other row flatter
    legal_min = lambda a: np.where(cold.get("layers.0.attn.mask"), 1.0, a).min(-1)  # noqa: E731
    assert np.all((a4.max(-1) < a0.max(-1))[:, 1:]) and np.all((legal_min(a4) > legal_min(a0))[:, 1:])


def test_edit_is_seen_downstream_and_patch_copies_another_prompt(tiny_model):
    toks_a, toks_b = tokens_for(TINY, 6, seed=17), tokens_for(TINY, 6, seed=18)
    clean = trace(tiny_model, toks_a)
    edited = trace(tiny_model, toks_a, interventions=[Edit("layers.1.mlp.out", lambda x: 2 * x)])
    np.testing.assert_allclose(edited.get("layers.1.mlp.out"), 2 * clean.get("layers.1.mlp.out"), rtol=1e-15)
    np.testing.assert_allclose(edited.get("layers.1.resid_post"),
                               edited.get("layers.1.resid_mid") + edited.get("layers.1.mlp.out"), atol=1e-12)
    assert np.abs(edited.get("logits") - clean.get("logits")).max() > 1e-3

    # Everything after resid_mid of the last layer depends only on it: patching it in
    # from prompt B makes prompt A's run produce B's logits.
    source = trace(tiny_model, toks_b)
    patched = trace(tiny_model, toks_a, interventions=[Patch("layers.1.resid_mid", source)])
    np.testing.assert_allclose(patched.get("logits"), source.get("logits"), rtol=1e-12, atol=1e-12)
    # Patching position 3 only changes position 3 of that snapshot.
    one = trace(tiny_model, toks_a, interventions=[Patch("layers.0.resid_post", source, positions=[3])])
    got, want = one.get("layers.0.resid_post"), clean.get("layers.0.resid_post")
    np.testing.assert_array_equal(got[3], source.get("layers.0.resid_post")[3])
    np.testing.assert_array_equal(np.delete(got, 3, 0), np.delete(want, 3, 0))
    with pytest.raises(ValueError, match="shape"):
        trace(tiny_model, toks_a[:4], interventions=[Patch("layers.0.resid_post", source)])


def test_tracing_changes_no_numbers_and_keeps_the_fast_path(tiny_model):
    toks = tokens_for(TINY, 9, seed=19)
    with ag.no_grad():
        plain = tiny_model(toks).data[0]
    np.testing.assert_allclose(trace(tiny_model, toks).get("logits"), plain, rtol=1e-12, atol=1e-12)
    np.testing.assert_array_equal(trace(tiny_model, toks, "logits").get("logits"), plain)
    t = Tracer(tiny_model, names="layers.1.attn.softmax")
    assert t.wants(["layers.1.attn.scores", "layers.1.attn.softmax"])
    assert not t.wants(["layers.0.attn.scores", "layers.0.attn.mask", "layers.0.attn.softmax"])
    assert not t.wants(["layers.0.attn_norm.rms"]) and not t.wants(["probs"])
    assert Tracer(tiny_model, names=(), interventions=[MaskOff(1)]).wants(["layers.1.attn.mask"])
    assert tiny_model._tracer is None


def test_name_filters_storage_dtype_and_batch_row(tiny_model):
    toks = np.stack([tokens_for(TINY, 5, seed=20), tokens_for(TINY, 5, seed=21)])
    t = trace(tiny_model, toks, "layers.1.attn.*", dtype=np.float16)
    assert t.names() == [f"layers.1.attn.{s}" for s in ("q", "k", "v", "rope_q", "rope_k", "cache_k", "cache_v",
                                                       "scores", "mask", "softmax", "mix", "head_out", "out")]
    assert t.get("layers.1.attn.q").dtype == np.float16 and t.get("layers.1.attn.mask").dtype == np.bool_
    row1 = trace(tiny_model, toks, batch=1)
    alone = trace(tiny_model, toks[1])
    assert row1.tokens.tolist() == toks[1].tolist()
    for name in alone.names():
        np.testing.assert_allclose(row1.get(name), alone.get(name), rtol=1e-10, atol=1e-12, err_msg=name)
    np.testing.assert_allclose(t.get("layers.1.attn.q"), trace(tiny_model, toks[0]).get("layers.1.attn.q"),
                               rtol=2e-3, atol=2e-3)


@pytest.mark.parametrize("make,match", [
    (lambda m: Tracer(m, names="layers.0.attn.nope"), "layers.0.attn.nope"),
    (lambda m: Tracer(m, names="layers.7.attn.q"), "layer 7"),
    (lambda m: Tracer(m, names=["attn.q", 3]), "str"),
    (lambda m: Tracer(m, dtype="int8"), "dtype"),
    (lambda m: Tracer(m, batch=-1), "batch"),
    (lambda m: Tracer(m, interventions=[ZeroAblate(0, 4)]), "head=4"),
    (lambda m: Tracer(m, interventions=[ZeroAblate(2, 0)]), "layer=2"),
    (lambda m: Tracer(m, interventions=[MeanAblate(0, 0, np.zeros(3))]), "mean"),
    (lambda m: Tracer(m, interventions=["ablate"]), "Intervention"),
    (lambda m: Temperature(0.0), "temperature"),
    (lambda m: Temperature(float("nan")), "temperature"),
    (lambda m: Edit("embed", 3), "function"),
])
def test_bad_arguments_are_one_line_errors(tiny_model, make, match):
    with pytest.raises((ValueError, TypeError), match=match) as info:
        make(tiny_model)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("temperature", [1e-40, 1e-300])
def test_a_score_temperature_too_small_for_the_dtype_is_an_error_not_nan(tiny_model, temperature):
    """Scores / 1e-40 overflow float32 (and 1 / 1e-300 itself does): a named error, never NaN weights."""
    model = Transformer(tiny_model.config, seed=0, dtype=np.float32)
    with pytest.raises(ValueError, match=f"temperature {temperature!r} is too small for layers.0.attn.scores"):
        trace(model, tokens_for(TINY, 4), ["attn.softmax"], interventions=[Temperature(temperature, layers=0)])
    t = trace(model, tokens_for(TINY, 4), ["attn.softmax"], interventions=[Temperature(1e-30, layers=0)])
    w = t.get("attn.softmax", layer=0)                              # tiny but representable: one-hot rows
    assert np.isfinite(w).all() and np.allclose(w.sum(-1), 1.0) and set(np.unique(w)) <= {0.0, 1.0}


def test_trace_reading_errors(tiny_model):
    t = trace(tiny_model, tokens_for(TINY, 4), ["layers.0.attn.out", "attn.mask"])
    for call, match in [
        (lambda: t.get("layers.1.attn.out"), "not recorded"),
        (lambda: t.get("attn.out"), "layer="),
        (lambda: t.get("attn.out", layer=5), "layer 5"),
        (lambda: t.get("layers.0.attn.out", head=0), "no head axis"),
        (lambda: t.get("attn.mask", layer=0, head=0), "no head axis"),
        (lambda: t.get("layers.0.attn.out", step=1), "step=1"),
        (lambda: t.grad("layers.0.attn.out"), "made without a loss; pass targets= to trace"),
    ]:
        with pytest.raises(ValueError, match=match):
            call()
    with Tracer(tiny_model) as outer:
        with pytest.raises(ValueError, match="already has a tracer"):
            Tracer(tiny_model).__enter__()
    assert outer.model._tracer is None
    with pytest.raises(ValueError, match="batch=2"):
        trace(tiny_model, np.zeros((2, 3), dtype=np.int64), batch=2)


# ----------------------------------------------------------------------------
# 6. Export and loading
# ----------------------------------------------------------------------------

def test_save_and_load_round_trip(tiny_model, tmp_path):
    toks = tokens_for(TINY, 5, seed=22)
    cache = tiny_model.new_cache()
    with Tracer(tiny_model, names=["attn.softmax", "attn.mask", "logits"], interventions=[ZeroAblate(0, 1)]) as t:
        logits = tiny_model(toks, cache)
        ag.cross_entropy(logits, tokens_for(TINY, 5, seed=23)[None]).backward()
        with ag.no_grad():
            tiny_model([[2]], cache)
    tiny_model.zero_grad()
    path = tmp_path / "run.npz"
    t.trace.save(path)
    back = load_trace(path)
    assert back.names() == t.trace.names() and back.config == TINY and back.interventions == t.trace.interventions
    assert [(s.n, s.m, s.start) for s in back.steps] == [(5, 5, 0), (1, 6, 5)]
    assert back.tokens.tolist() == toks.tolist() + [2]
    for s, s0 in zip(back.steps, t.trace.steps):
        assert set(s.values) == set(s0.values) and set(s.grads) == set(s0.grads)
        for k in s0.values:
            np.testing.assert_array_equal(s.values[k], s0.values[k])
        for k in s0.grads:
            np.testing.assert_array_equal(s.grads[k], s0.grads[k])
    assert set(back.steps[0].grads) == {"layers.0.attn.softmax", "layers.1.attn.softmax", "logits"}
    assert back.steps[1].grads == {}
    np.testing.assert_array_equal(back.logits, logits.data[0])         # recorded: the first forward's logits
    unrecorded = trace(tiny_model, toks, names=["embed"])
    unrecorded.save(tmp_path / "embed.npz")
    assert unrecorded.logits is not None and load_trace(tmp_path / "embed.npz").logits is None

    # Any npz reader gets the arrays and the manifest.
    with np.load(path) as z:
        manifest = json.loads(bytes(z["manifest.json"]))
        np.testing.assert_array_equal(z["values/1/layers.1.attn.softmax"], back.get("layers.1.attn.softmax", step=1))
    assert manifest["steps"][0]["shapes"]["layers.0.attn.softmax"] == [4, 5, 5]
    assert manifest["axes"]["layers.0.attn.mask"] == ["n", "m"]
    with pytest.raises(ValueError, match="does not exist"):
        t.trace.save(tmp_path / "no" / "such" / "dir.npz")


def rewrite(path, manifest=None, drop=None, add=None):
    """Copy a trace file with its manifest replaced, a member dropped or one added."""
    out = path.with_name("bad.npz")
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(out, "w") as dst:
        for info in src.infolist():
            if info.filename == drop:
                continue
            data = src.read(info)
            if info.filename == "manifest.json" and manifest is not None:
                data = manifest if isinstance(manifest, bytes) else json.dumps(manifest).encode()
            dst.writestr(info.filename, data)
        if add:
            dst.writestr(*add)
    return out


@pytest.fixture(scope="module")
def saved(tiny_model, tmp_path_factory):
    path = tmp_path_factory.mktemp("trace") / "t.npz"
    trace(tiny_model, tokens_for(TINY, 3), ["layers.0.attn.q", "layers.0.attn.mask"],
          targets=tokens_for(TINY, 3, seed=1)).save(path)
    with zipfile.ZipFile(path) as z:
        return path, json.loads(z.read("manifest.json"))


def test_malformed_trace_files_are_refused(saved, tmp_path):
    path, good = saved
    bad_manifests = []
    for key, value in [("format", "glassllm-model"), ("version", 2), ("version", True), ("batch", -1),
                       ("dtype", "int64"), ("names", ["layers.0.attn.zzz"]), ("axes", {}),
                       ("config", {"dim": "wide"}), ("config", {"n_layers": 10 ** 9}), ("steps", {})]:
        bad_manifests.append({**good, key: value})
    step = good["steps"][0]
    for key, value in [("m", 99), ("n", 0), ("tokens", [1, 2]), ("tokens", [1, 2, 10 ** 6]),
                       ("shapes", {"layers.0.attn.q": [4, 3, 31]}), ("grads", ["layers.0.attn.mask"])]:
        bad_manifests.append({**good, "steps": [{**step, key: value}]})
    for manifest in bad_manifests:
        with pytest.raises(ValueError, match="t.npz|bad.npz") as info:
            load_trace(rewrite(path, manifest))
        assert "\n" not in str(info.value)
    for kwargs, match in [(dict(manifest=b"{not json"), "JSON"), (dict(drop="manifest.json"), "manifest"),
                          (dict(drop="values/0/layers.0.attn.q.npy"), "missing"),
                          (dict(add=("extra.txt", "hi")), "unexpected"),
                          (dict(add=("values/0/x.npy", b"\x93NUMPY")), "unexpected")]:
        with pytest.raises(ValueError, match=match):
            load_trace(rewrite(path, **kwargs))
    # an array whose header disagrees with the manifest
    bad = tmp_path / "swap.npz"
    with zipfile.ZipFile(path) as src, zipfile.ZipFile(bad, "w") as dst:
        for info in src.infolist():
            data = src.read(info)
            if info.filename == "values/0/layers.0.attn.q.npy":
                from io import BytesIO
                buf = BytesIO()
                np.save(buf, np.zeros((4, 3, 7)))
                data = buf.getvalue()
            dst.writestr(info.filename, data)
    with pytest.raises(ValueError, match="the manifest says"):
        load_trace(bad)
    (tmp_path / "junk.npz").write_bytes(b"not a zip at all")
    with pytest.raises(ValueError, match="not a trace file"):
        load_trace(tmp_path / "junk.npz")
    with pytest.raises(ValueError, match="does not exist"):
        load_trace(tmp_path / "missing.npz")


def test_fuzzed_manifests_give_value_errors_only(saved):
    hypothesis = pytest.importorskip("hypothesis")
    st = hypothesis.strategies
    path, good = saved
    json_values = st.recursive(st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False)
                               | st.text(max_size=8),
                               lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner,
                                                                                           max_size=3),
                               max_leaves=8)
    step_keys = sorted(good["steps"][0])

    with tempfile.TemporaryDirectory() as d:
        copy = Path(d) / "t.npz"
        copy.write_bytes(path.read_bytes())

        @hypothesis.settings(max_examples=120, deadline=None, derandomize=True)
        @hypothesis.given(key=st.sampled_from(sorted(good) + [f"steps.{k}" for k in step_keys]), value=json_values)
        def check(key, value):
            manifest = json.loads(json.dumps(good))
            if key.startswith("steps."):
                manifest["steps"][0][key[6:]] = value
            else:
                manifest[key] = value
            try:
                tr.validate_manifest(manifest)
            except ValueError as e:
                assert str(e).startswith("trace manifest:") and "\n" not in str(e)
            try:                                       # the same manifest inside a file
                load_trace(rewrite(copy, manifest))
            except ValueError as e:
                assert "\n" not in str(e)

        check()
        assert load_trace(copy).names() == ["layers.0.attn.q", "layers.0.attn.mask"]


def test_corrupted_bytes_give_value_errors_only(saved, tmp_path):
    path, _ = saved
    raw = path.read_bytes()
    rng = np.random.default_rng(0)
    bad = tmp_path / "flipped.npz"
    for _ in range(300):
        data = bytearray(raw)
        for _ in range(int(rng.integers(1, 4))):
            data[int(rng.integers(len(data)))] = int(rng.integers(256))
        if rng.random() < 0.2:
            data = data[: int(rng.integers(len(data)))]
        bad.write_bytes(bytes(data))
        try:
            load_trace(bad)
        except ValueError as e:
            assert "\n" not in str(e)


# ----------------------------------------------------------------------------
# Padding, files, and the arguments a user can get wrong
# ----------------------------------------------------------------------------

def test_a_left_padded_row_records_its_padding_and_meanablate_leaves_it_out(tiny_model):
    """Row 1 of a batch of a 6- and a 2-token prompt: 4 positions of padding, said so, and not averaged."""
    from glassllm.nn import KVCache

    long_, short = tokens_for(TINY, 6, seed=1), tokens_for(TINY, 2, seed=2)
    batch = np.zeros((2, 6), dtype=np.int64)
    batch[0], batch[1, 4:] = long_, short
    cache = KVCache(TINY, 2, dtype=np.float64, pad=np.array([0, 4]))
    padded = trace(tiny_model, batch, ["attn.mix", "attn.softmax"], cache=cache, batch=1)
    alone = trace(tiny_model, short, ["attn.mix", "attn.softmax"])
    assert padded.pad == 4 and padded.steps[0].pad == 4 and alone.pad == 0
    mix = padded.get("attn.mix", layer=0, head=1)                      # (6, D); the last 2 rows are text
    np.testing.assert_allclose(mix[4:], alone.get("attn.mix", layer=0, head=1), rtol=1e-10, atol=1e-12)
    assert not padded.get("attn.softmax", layer=0)[:, :4].any()        # padded queries read nothing
    from_padded, from_alone = MeanAblate(0, 1, padded), MeanAblate(0, 1, alone)
    from_padded.bind(padded.axes, TINY)
    from_alone.bind(alone.axes, TINY)
    np.testing.assert_allclose(from_padded.head_mean, from_alone.head_mean, rtol=1e-10, atol=1e-12)
    assert np.abs(mix.mean(axis=0) - from_alone.head_mean).max() > 1e-3    # the padded rows would have moved it


def test_a_saved_trace_keeps_its_loss_padding_and_intervention_details(tiny_model, tmp_path):
    toks = tokens_for(TINY, 5)
    t = trace(tiny_model, toks, ["logits", "attn.mix"], targets=np.roll(toks, -1),
              interventions=[MeanAblate(0, 1, np.arange(TINY.head_dim) / 10)])
    t.save(tmp_path / "t.npz")
    back = load_trace(tmp_path / "t.npz")
    assert back.loss == t.loss and back.loss is not None and back.pad == 0
    assert back.interventions == t.interventions and "mean=[0. , 0.1, 0.2" in back.interventions[0]


def test_a_trace_already_handed_out_does_not_grow_with_later_forwards(tiny_model):
    tracer = Tracer(tiny_model, names="logits")
    with ag.no_grad(), tracer:
        tiny_model(tokens_for(TINY, 3))
    first = tracer.trace
    with ag.no_grad(), tracer:
        tiny_model(tokens_for(TINY, 2))
    assert len(first.steps) == 1 and len(tracer.trace.steps) == 2


def test_an_intervention_may_not_change_a_snapshots_dtype(tiny_model):
    class Widen(tr.Intervention):
        def bind(self, axes, config):
            return ["layers.0.resid_mid"]

        def apply(self, name, t, step):
            return ag.Tensor(t.data.astype(np.float32))

    with pytest.raises(ValueError, match="returned float32 .* expected a Tensor of float64"):
        trace(tiny_model, tokens_for(TINY, 3), "logits", interventions=[Widen()])


@pytest.mark.parametrize("call,error,match", [
    (lambda m: Tracer("model"), TypeError, "Tracer needs a glassllm Transformer, got str"),
    (lambda m: trace(m, [1, 2], cache="x"), TypeError, "cache must be a KVCache"),
    (lambda m: trace(m, [1, 2, 3], targets=[1, 2]), ValueError, r"targets of shape \(2,\) do not match"),
    (lambda m: trace(m, [1, 2], names=b"logits"), TypeError, "names must be a str, a list of str or a function of a name, got bytes"),
    (lambda m: trace(m, [1, 2], names={"logits": 1}), TypeError, "got dict"),
    (lambda m: trace(m, [1, 2], interventions=[Temperature(2, layers=1.0)]), TypeError, "layers must be an int"),
    (lambda m: trace(m, [1, 2], interventions=[Temperature(2, heads=[])]), ValueError, "heads is empty"),
    (lambda m: trace(m, [1, 2], interventions=[MaskOff([])]), ValueError, "layers is empty"),
    (lambda m: trace(m, [1, 2], interventions=[MeanAblate(0, 0, "abc")]), TypeError, "MeanAblate: mean must be"),
    (lambda m: trace(m, [1, 2], interventions=[Edit("embed", lambda x: x * np.nan)]), ValueError,
     "Edit of 'embed': the new values are NaN or infinite"),
    (lambda m: trace(m, [1, 2], interventions=[Edit("embed", lambda x: x + 1j)]), ValueError, "complex"),
    (lambda m: Patch("embed", np.full((2, TINY.dim), np.inf)), ValueError, "Patch source must be finite"),
    (lambda m: tr.snapshot_shape("logits", n=-3), ValueError, "n=-3"),
    (lambda m: tr.snapshot_shape("logits", n=2.5), TypeError, "n must be an int"),
    (lambda m: tr.snapshot_shape("layers.0.attn.scores", n=5, m=2), ValueError, "1 <= n <= m"),
    (lambda m: tr.snapshot_shape("logits", "tiny"), TypeError, "config must be a ModelConfig or a model, got str"),
    (lambda m: trace(m, [1, 2], interventions=[MeanAblate(0, 0, None)]), TypeError, "mean must be 8 numbers"),
    (lambda m: trace(m, [1, 2], interventions=[MeanAblate(0, 0, np.full(TINY.head_dim, np.nan))]), ValueError,
     "MeanAblate of 'layers.0.attn.mix': the new values are NaN"),
])
def test_arguments_a_user_can_get_wrong_are_named(tiny_model, call, error, match):
    with pytest.raises(error, match=match) as info:
        call(tiny_model)
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("make,error,match", [
    (lambda: ZeroAblate(0, 1.5), TypeError, "head must be an int, got 1.5"),
    (lambda: ZeroAblate("0", 1), TypeError, "layer must be an int, got '0'"),
    (lambda: MeanAblate(True, 0, np.zeros(TINY.head_dim)), TypeError, "layer must be an int, got True"),
    (lambda: MaskOff([0, 1.0]), TypeError, "layer must be an int, got 1.0"),
    (lambda: MaskOff([]), ValueError, "layers is empty"),
    (lambda: Temperature(2.0, heads="all"), TypeError, "heads must be an int, a list of ints or None, got 'all'"),
    (lambda: Temperature(0.0), ValueError, "temperature must be a finite number > 0, got 0.0"),
])
def test_an_intervention_checks_what_holds_for_any_model_when_it_is_made(make, error, match):
    with pytest.raises(error, match=match) as info:                   # no model, no tracer: the constructor
        make()
    assert "\n" not in str(info.value)


def test_an_intervention_checks_its_layers_and_heads_against_the_model_it_is_bound_to():
    big, small = ModelConfig(n_layers=4, n_heads=4, n_kv_heads=2, dim=32, ffn_dim=64, vocab_size=64), TINY
    ablate = ZeroAblate(3, -1)                                         # fine for any model with 4 layers
    assert ablate.bind(tr.registry(big), big) == ["layers.3.attn.mix"]
    with pytest.raises(ValueError, match=rf"layer=3 is out of range: expected 0..{small.n_layers - 1}"):
        ablate.bind(tr.registry(small), small)


def test_snapshot_shape_takes_a_model_or_its_config(tiny_model):
    assert tr.snapshot_shape("layers.1.attn.scores", tiny_model, 3, 5) == \
        tr.snapshot_shape("layers.1.attn.scores", TINY, 3, 5) == (TINY.n_heads, 3, 5)


def test_targets_under_no_grad_are_refused_before_the_forward(tiny_model):
    with ag.no_grad(), pytest.raises(ValueError, match="outside no_grad"):
        trace(tiny_model, [1, 2, 3], targets=[2, 3, 4])


def test_every_read_of_a_trace_is_read_only(tiny_model):
    t = trace(tiny_model, tokens_for(TINY, 3), ["attn.softmax", "logits"])
    for a in (t.get("logits"), t.get("attn.softmax", layer=0), t.get("attn.softmax", layer=0, head=1)):
        assert not a.flags.writeable


# ----------------------------------------------------------------------------
# Plotting (matplotlib, Agg)
# ----------------------------------------------------------------------------

class _Pieces:
    """A stand-in tokenizer: the piece of id i is ``t{i}``."""

    def piece(self, i):
        return f"t{i}"


def test_plot_draws_the_snapshot_itself_with_the_mask_and_the_tokens(tiny_model):
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ids = tokens_for(TINY, 6, seed=4)
    t = trace(tiny_model, ids, names=["attn.softmax", "layers.0.resid_post", "layers.1.attn_norm.rms"])
    H = TINY.n_heads
    fig, ax = plt.subplots()
    image = t.plot("attn.softmax", layer=1, head=H - 1, tokenizer=_Pieces(), ax=ax)
    drawn, want = image.get_array(), t.get("attn.softmax", layer=1, head=H - 1)
    np.testing.assert_array_equal(drawn.mask, np.triu(np.ones((6, 6), dtype=bool), k=1))  # the causal future
    np.testing.assert_array_equal(drawn.filled(0.0), want)                                # every number as traced
    assert image.get_clim() == (0.0, 1.0)
    assert [x.get_text() for x in ax.get_xticklabels()] == [f"'t{i}' {k}" for k, i in enumerate(ids)]
    assert ax.get_ylabel() == "query position" and ax.get_title() == f"layers.1.attn.softmax · head {H - 1}"

    # Signed values: a scale symmetric around 0; a (n,) snapshot is one column.
    image = t.plot("layers.0.resid_post", ax=plt.subplots()[1])
    top = np.abs(t.get("layers.0.resid_post")).max()
    assert image.get_clim() == (-top, top) and not image.get_array().mask.any()
    assert t.plot("attn_norm.rms", layer=1, ax=plt.subplots()[1]).get_array().shape == (6, 1)

    # With the mask switched off (and recorded), nothing is marked forbidden.
    off = trace(tiny_model, ids, names=["layers.0.attn.softmax", "layers.0.attn.mask"], interventions=[MaskOff(0)])
    assert not off.plot("attn.softmax", layer=0, head=0, ax=plt.subplots()[1]).get_array().mask.any()
    with pytest.raises(ValueError, match=r"axes \(H, n, m\): pass head="):
        t.plot("attn.softmax", layer=1)
    with pytest.raises(ValueError, match="was not recorded"):
        t.plot("attn.q", layer=0, head=0)
    plt.close("all")


def test_plot_of_a_gradient_is_symmetric_around_zero(tiny_model):
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    ids = tokens_for(TINY, 5, seed=2)
    with Tracer(tiny_model, names=["layers.1.attn.scores"]) as tracer:
        tiny_model.loss(ids[None, :-1], ids[None, 1:]).backward()
    t = tracer.trace
    image = t.plot("attn.scores", layer=1, head=0, grad=True, ax=plt.subplots()[1])
    g = t.grad("attn.scores", layer=1, head=0)
    top = np.abs(g[~np.triu(np.ones(g.shape, dtype=bool), k=1)]).max()
    assert image.get_clim() == (-top, top)
    np.testing.assert_array_equal(image.get_array().filled(0.0), np.tril(g))
    plt.close("all")


# ----------------------------------------------------------------------------
# Interventions: values checked in the model's dtype; binding again means the same
# ----------------------------------------------------------------------------

def test_new_values_that_overflow_the_models_dtype_are_refused():
    """1e39 is finite in float64 but infinite in float32: an edit, a patch or a mean that would
    make the model's numbers infinite is a one-line error, not NaN logits."""
    model = Transformer(TINY, seed=0, dtype=np.float32)
    ids = tokens_for(TINY, 3)
    huge = lambda x: np.full(x.shape, 1e39)  # noqa: E731
    with pytest.raises(ValueError, match=r"Edit of 'embed': .*infinite in float32"):
        trace(model, ids, names=["logits"], interventions=Edit("embed", huge))
    with pytest.raises(ValueError, match=r"Patch of 'embed': .*infinite in float32"):
        trace(model, ids, names=["logits"], interventions=Patch("embed", np.full((3, TINY.dim), 1e39)))
    with pytest.raises(ValueError, match=r"MeanAblate of 'layers.0.attn.mix': .*infinite in float32"):
        trace(model, ids, names=["logits"], interventions=MeanAblate(0, 0, np.full(TINY.head_dim, 1e39)))
    # the same values are fine where they fit
    wide = Transformer(TINY, seed=0, dtype=np.float64)
    assert np.isfinite(trace(wide, ids, names=["embed"], interventions=Edit("embed", huge)).get("embed")).all()


def test_an_edit_of_the_mask_takes_booleans():
    with pytest.raises(ValueError, match="a mask takes True/False"):
        trace(Transformer(TINY, seed=0), tokens_for(TINY, 3), names=["layers.0.attn.mask"],
              interventions=Edit("layers.0.attn.mask", lambda x: np.full(x.shape, 0.5)))


def test_an_intervention_bound_again_to_another_model_means_what_it_said():
    """MaskOff() is every layer of whichever model it is given; bind must not freeze the first one's."""
    small, big = ModelConfig(**{**TINY.to_dict(), "n_layers": 1}), ModelConfig(**{**TINY.to_dict(), "n_layers": 3})
    ids = tokens_for(TINY, 4)
    off, hotter = MaskOff(), Temperature(2.0)
    trace(Transformer(small, seed=0), ids, names=["logits"], interventions=[off, hotter])
    assert repr(off) == "MaskOff(layers=None)" and repr(hotter) == "Temperature(2.0, layers=None, heads=None)"
    t = trace(Transformer(big, seed=0), ids, names="attn.mask", interventions=[off, hotter])
    assert [bool(t.get("attn.mask", layer=i).any()) for i in range(3)] == [False, False, False]
    mean = MeanAblate(0, 1, trace(Transformer(big, seed=0), ids, names="attn.mix"))
    trace(Transformer(big, seed=0), ids, names=["logits"], interventions=mean)
    assert isinstance(mean.mean, tr.Trace) and mean.head_mean.shape == (TINY.head_dim,)

    # Two live tracers sharing one Patch, on models of 3 and 1 layers: both still run.
    patch = Patch("attn.mix", np.zeros((4, TINY.n_heads, TINY.head_dim)), positions=[0])
    with pytest.raises(ValueError, match="exactly one name"):
        Tracer(Transformer(big, seed=0), interventions=patch)                # attn.mix of 3 layers
    patch = Patch("layers.0.attn.mix", np.zeros((TINY.n_heads, 4, TINY.head_dim)), positions=[0])
    deep, shallow = Transformer(big, seed=0), Transformer(small, seed=0)
    with Tracer(deep, names=["layers.0.attn.mix"], interventions=patch) as on_deep:
        with Tracer(shallow, names=["layers.0.attn.mix"], interventions=patch) as on_shallow:
            shallow(ids[None])
        deep(ids[None])
    for t in (on_deep.trace, on_shallow.trace):
        assert not t.get("attn.mix", layer=0)[:, 0].any() and t.get("attn.mix", layer=0)[:, 1:].any()


def test_a_layer_or_head_given_twice_is_refused():
    ids = tokens_for(TINY, 3)
    with pytest.raises(ValueError, match="layers lists layer 0 twice"):
        trace(Transformer(TINY, seed=0), ids, interventions=Temperature(2.0, layers=[0, 0]))
    with pytest.raises(ValueError, match="heads lists head 1 twice"):
        trace(Transformer(TINY, seed=0), ids, interventions=Temperature(2.0, heads=[1, 1]))


def test_patch_positions_are_checked_when_the_patch_is_made_and_bound():
    with pytest.raises(ValueError, match="Patch positions is empty"):
        Patch("embed", np.zeros((3, TINY.dim)), positions=[])
    with pytest.raises(ValueError, match="need an n axis; 'layers.0.attn.cache_k'"):
        Tracer(Transformer(TINY, seed=0), interventions=Patch("layers.0.attn.cache_k", np.zeros((2, 3, 8)),
                                                                    positions=[0]))


def test_the_keys_of_a_step_are_its_own_forwards_tokens(tiny_model):
    """Two separate forwards under one tracer: the second step's keys are its own tokens, not the first's
    (Trace.context), both in the plot's labels and for a cached continuation."""
    pytest.importorskip("matplotlib")
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    first, second = tokens_for(TINY, 3, seed=5), tokens_for(TINY, 2, seed=6)
    with Tracer(tiny_model, names=["layers.0.attn.softmax"]) as tracer:
        tiny_model(first[None])
        tiny_model(second[None])
        cache = tiny_model.new_cache(1)
        tiny_model(first[None], cache)
        tiny_model(second[:1][None], cache)                             # continues the cached forward
    t = tracer.trace
    np.testing.assert_array_equal(t.context(0), first)
    np.testing.assert_array_equal(t.context(1), second)
    np.testing.assert_array_equal(t.context(3), np.concatenate([first, second[:1]]))
    assert t.tokens.tolist() == [*first, *second, *first, second[0]]   # every step's tokens, in order
    image = t.plot("attn.softmax", layer=0, head=0, step=1, tokenizer=_Pieces(), ax=plt.subplots()[1])
    assert [x.get_text() for x in image.axes.get_xticklabels()] == [f"'t{i}' {k}" for k, i in enumerate(second)]

    # A cache filled before tracing: the first positions' ids are unknown, and are not made up.
    cache = tiny_model.new_cache(1)
    tiny_model(first[None], cache)
    with Tracer(tiny_model, names=["layers.0.attn.softmax"]) as tracer:
        tiny_model(second[None], cache)
        tiny_model(first[:1][None], cache)
    t = tracer.trace
    np.testing.assert_array_equal(t.context(1), [*second, first[0]])         # positions 3, 4, 5
    image = t.plot("attn.softmax", layer=0, head=0, step=1, tokenizer=_Pieces(), ax=plt.subplots()[1])
    assert [x.get_text() for x in image.axes.get_xticklabels()] == [f"'t{second[0]}' 3", f"'t{second[1]}' 4",
                                                                     f"'t{first[0]}' 5"]
    assert list(image.axes.get_xticks()) == [3, 4, 5]
    plt.close("all")


# ----------------------------------------------------------------------------
# The trace as a mapping; TransformerLens' names as aliases
# ----------------------------------------------------------------------------

def test_a_trace_is_a_read_only_mapping_of_its_first_pass():
    from collections.abc import Mapping

    model = randomize(Transformer(TINY, seed=0), np.random.default_rng(3))
    with Tracer(model, names=["embed", "attn.softmax", "logits"]) as tracer:
        cache = model.new_cache(1)
        model([1, 2, 3], cache)
        model([4], cache)
    t = tracer.trace
    assert isinstance(t, Mapping)
    want = ["embed", "layers.0.attn.softmax", "layers.1.attn.softmax", "logits"]
    assert list(t) == list(t.keys()) == want and len(t) == 4
    assert t["embed"] is t.get("embed", step=0) and t["logits"].shape == (3, TINY.vocab_size)   # the first pass
    assert t["attn.softmax", 1] is t["layers.1.attn.softmax"] is t["attn.softmax", -1]
    assert "layers.0.attn.softmax" in t and ("attn.softmax", 0) in t
    assert "attn.softmax" not in t and "layers.0.attn.q" not in t and "nonsense" not in t and 3 not in t
    assert dict(t.items()).keys() == set(want)
    with pytest.raises(KeyError, match=r"matches 2 snapshots.*trace\['attn.softmax', 0\]"):
        t["attn.softmax"]
    with pytest.raises(KeyError, match="'layers.0.attn.q' was not recorded"):
        t["attn.q", 0]
    with pytest.raises(KeyError, match="layer 5 does not exist"):
        t["attn.softmax", 5]
    with pytest.raises(TypeError):
        t["embed"] = np.zeros(3)                           # read-only: no item assignment
    with pytest.raises(ValueError):
        t["embed"][0, 0] = 1.0                              # and the arrays are read-only
    assert t == t and t != tracer.trace and len({t}) == 1   # equal only to itself, hashable


def test_transformer_lens_names_work_wherever_a_name_is_taken():
    model = randomize(Transformer(TINY, seed=0), np.random.default_rng(4))
    ids, targets = [3, 1, 4, 1, 5], [1, 4, 1, 5, 9]
    t = trace(model, ids, targets=targets)
    # get and grad: the hook names and TransformerLens' short names, with and without layer=.
    for ours, theirs, layer in [("layers.1.attn.softmax", "blocks.1.attn.hook_pattern", None),
                                ("layers.0.attn.mix", "z", 0), ("layers.0.mlp.prod", "mlp.hook_post", 0),
                                ("norm.rms", "ln_final.hook_scale", None), ("logits", "unembed.hook_out", None),
                                ("layers.1.attn_norm.rms", "blocks.1.ln1.hook_scale", None)]:
        assert t.get(theirs, layer=layer) is t.get(ours) and t.grad(theirs, layer=layer) is t.grad(ours)
    # names= and every intervention.
    assert trace(model, ids, names="blocks.0.hook_resid_mid").names() == ["layers.0.resid_mid"]
    assert trace(model, ids, names="hook_z").names() == ["layers.0.attn.mix", "layers.1.attn.mix"]
    shift = lambda a: a + 1.0                                                  # noqa: E731
    source = trace(model, [2, 7, 2, 8])
    for iv_ours, iv_theirs in [(Edit("layers.1.resid_pre", shift), Edit("blocks.1.hook_resid_pre", shift)),
                               (Patch("layers.0.attn.mix", source, heads=[1]), Patch("blocks.0.attn.hook_z", source, heads=[1])),
                               (tr.Hook("layers.0.mlp.gate", lambda v, ctx: v * 2.0),
                                tr.Hook("blocks.0.mlp.hook_pre", lambda v, ctx: v * 2.0))]:
        a = trace(model, [2, 7, 1, 8], names="logits", interventions=iv_ours).get("logits")
        b = trace(model, [2, 7, 1, 8], names="logits", interventions=iv_theirs).get("logits")
        np.testing.assert_array_equal(a, b)
    # the patching sweeps take them too
    a = tr.patching.heads(model, [2, 7, 1, 8], [2, 7, 2, 8], metric=tr.patching.logit_diff(3, 4))
    b = tr.patching.heads(model, [2, 7, 1, 8], [2, 7, 2, 8], name="hook_z", metric=tr.patching.logit_diff(3, 4))
    np.testing.assert_array_equal(np.asarray(a), np.asarray(b))
    with pytest.raises(ValueError, match="no snapshot is named 'blocks.0.attn.hook_nothing'"):
        trace(model, ids, names="blocks.0.attn.hook_nothing")


def test_names_may_be_a_filter_of_either_name():
    model = Transformer(TINY, seed=0)
    ours = trace(model, [1, 2], names=lambda name: name.endswith("attn.softmax"))
    theirs = trace(model, [1, 2], names=lambda name: name.endswith("hook_pattern"))
    assert ours.names() == theirs.names() == ["layers.0.attn.softmax", "layers.1.attn.softmax"]
    assert trace(model, [1, 2], names=lambda name: False).names() == []
    with pytest.raises(TypeError, match="must return True or False, got 'yes'"):
        trace(model, [1, 2], names=lambda name: "yes")


def test_text_in_is_read_as_generate_reads_a_prompt_and_gives_the_logits():
    from glassllm.checks import ParameterError
    from glassllm.tokenizer import Tokenizer

    tok = Tokenizer.train(["once upon a time there was a cat. " * 30], vocab_size=270)
    config = ModelConfig(vocab_size=270, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=32)
    model = randomize(Transformer(config, seed=0), np.random.default_rng(5))
    text = "<|endoftext|>Once upon a time"
    ids = tok.encode_prompt(text)
    assert ids[0] == tok.eot_id                                  # the special token, as generate reads it
    t = trace(model, text, tokenizer=tok, names="attn.softmax")
    want = trace(model, ids, names="attn.softmax")
    assert t.tokens.tolist() == ids and t.tokenizer is tok
    for name in want:
        np.testing.assert_array_equal(t[name], want[name])
    np.testing.assert_array_equal(t.logits, want.logits)
    np.testing.assert_allclose(t.logits, model(np.array(ids)).data[0], rtol=1e-5, atol=1e-5)  # (n, V)
    assert not t.logits.flags.writeable
    with_loss = trace(model, text, tokenizer=tok, targets=ids[1:] + [0])
    np.testing.assert_array_equal(with_loss.logits, with_loss["logits"])        # every snapshot: the teaching path
    np.testing.assert_allclose(with_loss.logits, t.logits, rtol=1e-5, atol=1e-5)
    with pytest.raises(ParameterError, match="tokens is text but no tokenizer was given"):
        trace(model, text)
    with pytest.raises(ParameterError, match="tokens is empty"):
        trace(model, "", tokenizer=tok)
    with pytest.raises(ParameterError, match="tokenizer has 270 ids but the model expects 53"):
        trace(Transformer(TINY, seed=0), text, tokenizer=tok)


def test_the_logits_of_one_row_are_the_forwards_own_and_a_batch_keeps_a_copy_of_its_row():
    """One row: trace.logits is the forward's output, read-only, not a second (n, V) array (the recorded
    ``logits`` snapshot shares it); a batch: a copy of the kept row alone. Values as the model's forward."""
    config = ModelConfig(vocab_size=64, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=16)
    model = randomize(Transformer(config, seed=0), np.random.default_rng(3))
    ids = np.array([[3, 9, 4, 1, 7], [2, 8, 8, 5, 6]])
    with ag.no_grad():
        want = model(ids).data                                                  # (B, n, V)
    one = tr.trace(model, ids[1])
    np.testing.assert_array_equal(one.logits, one["logits"])
    np.testing.assert_allclose(one.logits, want[1], rtol=1e-5, atol=1e-6)
    assert np.shares_memory(one.logits, one["logits"]) and not one.logits.flags.writeable
    both = tr.trace(model, ids, batch=1)
    np.testing.assert_allclose(both.logits, want[1], rtol=1e-5, atol=1e-6)
    assert both.logits.base is None or both.logits.base.shape == (5, 64)       # the row alone, not the batch
    assert not both.logits.flags.writeable
