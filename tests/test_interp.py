"""Interpretability tools on glassllm's own float64 path, against hand recomputations.

- ``attn.head_out``: each head's slice of mix through its slice of W_O; the heads sum to ``attn.out``.
- ``Hook`` keeps the graph: its gradients equal central finite differences of the hooked loss,
  where an ``Edit`` of the same values stops them.
- ``Patch(heads=, positions=)`` replaces exactly those cells; negative layer and head indices
  mean what they mean in Python.
- ``trace(targets=, loss_at=)`` is the cross-entropy of the chosen positions only.
- The logit lens, the decomposition and the attributions add up (1e-10): the lens's last row is
  the logits, the parts sum to the final norm's input, the attributions to the logit difference.
(The same functions against TransformerLens itself: tests/test_transformer_lens.py.)
"""

from __future__ import annotations

import numpy as np
import pytest

from glassllm import autograd as ag
from glassllm.nn import Transformer
from glassllm.trace import (Edit, Hook, Patch, Temperature, Tracer, ZeroAblate, decompose, logit_attrs,
                            logit_lens, trace)
from tests.support.glassllm_testing import TINY, randomize

L, H, D, C = TINY.n_layers, TINY.n_heads, TINY.head_dim, TINY.dim


@pytest.fixture(scope="module")
def model():
    return randomize(Transformer(TINY, seed=0, dtype=np.float64), np.random.default_rng(5))


def ids(n, seed=0):
    return np.random.default_rng(seed).integers(0, TINY.vocab_size, size=n)


def log_softmax(x):
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


# ----------------------------------------------------------------------------
# head_out
# ----------------------------------------------------------------------------

def test_head_out_is_each_heads_share_and_they_sum_to_out(model):
    t = trace(model, ids(6), names=["attn.mix", "attn.head_out", "attn.out"])
    for i in range(L):
        wo = model.layers[i].attention.wo.weight.data                 # (C, H*D)
        mix, head_out = t.get("attn.mix", layer=i), t.get("attn.head_out", layer=i)
        assert head_out.shape == (H, 6, C)
        for h in range(H):
            np.testing.assert_allclose(head_out[h], mix[h] @ wo[:, h * D:(h + 1) * D].T, rtol=0, atol=1e-12)
        np.testing.assert_allclose(head_out.sum(0), t.get("attn.out", layer=i), rtol=0, atol=1e-12)
    # Asking for head_out changes nothing downstream.
    with ag.no_grad():
        plain = model(ids(6)[None]).data[0]
    np.testing.assert_allclose(trace(model, ids(6), names="attn.head_out").get("attn.head_out", layer=0),
                               t.get("attn.head_out", layer=0), rtol=0, atol=0)
    np.testing.assert_allclose(trace(model, ids(6), names=["attn.head_out", "logits"]).get("logits"), plain,
                               rtol=0, atol=1e-12)


# ----------------------------------------------------------------------------
# Hook, Patch, negative indices
# ----------------------------------------------------------------------------

def _hooked_loss(model, toks, targets, scale, edit_embed=None):
    hook = Hook("layers.0.attn.head_out", lambda v, ctx: v * scale)
    ivs = [hook] if edit_embed is None else [hook, Edit("embed", edit_embed)]
    with ag.no_grad():
        return trace(model, toks, names=["logits"], interventions=ivs).get("logits"), ivs


def test_a_hook_keeps_the_gradient_and_an_edit_stops_it(model):
    toks, targets = ids(5, 1), ids(5, 2)
    scale = np.array([1.0, 0.5, -2.0, 1.5])[:, None, None]           # (H, 1, 1): one factor per head
    seen = []

    def fn(v, ctx):
        seen.append((ctx.name, ctx.layer, ctx.axes, ctx.head_axis, ctx.position_axis, ctx.positions.tolist()))
        return v * scale

    t = trace(model, toks, names=["embed", "layers.0.attn.head_out"], targets=targets,
              interventions=Hook("layers.0.attn.head_out", fn))
    assert seen == [("layers.0.attn.head_out", 0, ("B", "H", "n", "C"), 1, 2, [0, 1, 2, 3, 4])]
    # The gradient of the embedding, by central differences of the hooked loss.
    def loss_with(embed):
        logits = trace(model, toks, names=["logits"], interventions=[
            Edit("embed", lambda _: embed), Hook("layers.0.attn.head_out", lambda v, ctx: v * scale)]).get("logits")
        return -log_softmax(logits)[np.arange(5), targets].mean()

    base = t.get("embed")
    for p, c in [(0, 3), (2, 11), (4, 30)]:
        e = np.zeros_like(base)
        e[p, c] = 1e-6
        numeric = (loss_with(base + e) - loss_with(base - e)) / 2e-6
        assert t.grad("embed")[p, c] == pytest.approx(numeric, rel=1e-6, abs=1e-10)
    # The stored head_out is what the hook returned, so its gradient is out's; mix's passes through the hook.
    both = trace(model, toks, names=["layers.0.attn.out", "layers.0.attn.mix"], targets=targets,
                 interventions=Hook("layers.0.attn.head_out", fn))
    out_grad = both.grad("attn.out", layer=0)                           # (n, C)
    np.testing.assert_allclose(t.grad("attn.head_out", layer=0), np.broadcast_to(out_grad, (H, 5, C)),
                               rtol=1e-12, atol=1e-15)
    wo = model.layers[0].attention.wo.weight.data                     # (C, H*D)
    for h in range(H):
        np.testing.assert_allclose(both.grad("attn.mix", layer=0)[h],
                                   scale[h, 0, 0] * out_grad @ wo[:, h * D:(h + 1) * D], rtol=1e-10, atol=1e-14)
    # An Edit that returns the same numbers is a constant: nothing upstream of it learns through it.
    same = trace(model, toks, names=["layers.0.attn.v", "layers.0.attn.head_out"], targets=targets,
                 interventions=Edit("layers.0.attn.head_out", lambda v: v * scale[:, :, 0][:, :, None]))
    np.testing.assert_array_equal(same.grad("attn.v", layer=0), 0.0)
    hooked = trace(model, toks, names="layers.0.attn.v", targets=targets,
                   interventions=Hook("layers.0.attn.head_out", fn))
    assert np.abs(hooked.grad("attn.v", layer=0)).max() > 1e-6
    assert same.loss == pytest.approx(t.loss, rel=1e-12)


def test_a_hook_may_look_only_or_return_an_array(model):
    toks = ids(4)
    plain = trace(model, toks, names="logits").get("logits")
    looked = trace(model, toks, names="logits", interventions=Hook("attn.softmax", lambda v, ctx: None))
    np.testing.assert_allclose(looked.get("logits"), plain, rtol=0, atol=1e-12)   # (the teaching path)
    zeros = Hook("layers.1.mlp.out", lambda v, ctx: np.zeros(v.shape))
    t = trace(model, toks, names=["layers.1.mlp.out", "logits"], interventions=zeros)
    assert not t.get("mlp.out", layer=1).any()
    with pytest.raises(ValueError, match="expected a Tensor of float64"):
        trace(model, toks, interventions=Hook("embed", lambda v, ctx: v[:, :2]))
    with pytest.raises(TypeError, match="Hook needs a function"):
        Hook("embed", 3)


def test_patch_heads_and_positions_replace_exactly_those_cells(model):
    clean, corrupt = ids(6, 3), ids(6, 4)
    source = trace(model, clean, names="attn.mix")
    base = trace(model, corrupt, names="attn.mix")
    t = trace(model, corrupt, names="attn.mix",
              interventions=Patch("layers.0.attn.mix", source, heads=[1, -1], positions=[2, -2]))
    got, want, was = t.get("attn.mix", layer=0), source.get("attn.mix", layer=0), base.get("attn.mix", layer=0)
    chosen = np.zeros((H, 6), dtype=bool)
    chosen[np.ix_([1, H - 1], [2, 4])] = True
    np.testing.assert_array_equal(got[chosen], want[chosen])
    np.testing.assert_array_equal(got[~chosen], was[~chosen])
    # A head of the key/value heads (G) for k.
    t = trace(model, corrupt, names="attn.k", interventions=Patch("layers.1.attn.k", trace(model, clean, "attn.k"),
                                                                   heads=0))
    assert not np.array_equal(t.get("attn.k", layer=1)[0], base_k := trace(model, corrupt, "attn.k")
                              .get("attn.k", layer=1)[0])
    np.testing.assert_array_equal(t.get("attn.k", layer=1)[1:], trace(model, corrupt, "attn.k")
                                  .get("attn.k", layer=1)[1:])
    assert base_k.shape == (6, D)
    for bad, match in [(dict(heads=[H]), "head=4 is out of range"), (dict(heads=[1, -3]), "lists head 1 twice"),
                       (dict(heads=[]), "heads is empty")]:
        with pytest.raises(ValueError, match=match):
            trace(model, corrupt, interventions=Patch("layers.0.attn.mix", source, **bad))
    with pytest.raises(ValueError, match="need a head axis; 'layers.0.attn.out'"):
        trace(model, corrupt, interventions=Patch("layers.0.attn.out", trace(model, clean, "attn.out"), heads=0))


def test_negative_layers_and_heads_count_from_the_end(model):
    toks = ids(5)
    t = trace(model, toks, names=["attn.softmax", "logits"])
    np.testing.assert_array_equal(t.get("attn.softmax", layer=-1, head=-1), t.get("attn.softmax", layer=L - 1,
                                                                                     head=H - 1))
    np.testing.assert_array_equal(t.get("attn.softmax", layer=-L), t.get("attn.softmax", layer=0))
    for neg, pos in [(ZeroAblate(-1, -2), ZeroAblate(L - 1, H - 2)),
                     (Temperature(3.0, layers=[-1], heads=[-1]), Temperature(3.0, layers=[L - 1], heads=[H - 1]))]:
        np.testing.assert_array_equal(trace(model, toks, names="logits", interventions=neg).get("logits"),
                                      trace(model, toks, names="logits", interventions=pos).get("logits"))
    with pytest.raises(ValueError, match=f"layer -3 does not exist: the model has layers 0..{L - 1}"):
        t.get("attn.softmax", layer=-3)
    with pytest.raises(ValueError, match="lists layer 1 twice"):
        Tracer(model, interventions=Temperature(2.0, layers=[1, -1]))


# ----------------------------------------------------------------------------
# loss_at
# ----------------------------------------------------------------------------

def test_loss_at_is_the_cross_entropy_of_those_positions(model):
    toks, targets = ids(6, 7), ids(6, 8)
    logits = trace(model, toks, names="logits").get("logits")
    nll = -log_softmax(logits)[np.arange(6), targets]
    assert trace(model, toks, names=[], targets=targets, loss_at=-1).loss == pytest.approx(nll[5], rel=1e-12)
    assert trace(model, toks, names=[], targets=targets[[1, 4]], loss_at=[1, -2]).loss == \
        pytest.approx(nll[[1, 4]].mean(), rel=1e-12)
    t = trace(model, toks, names="logits", targets=[targets[5]], loss_at=-1)
    assert not t.grad("logits")[:5].any() and t.grad("logits")[5].any()
    full = targets.copy()
    full[:5] = -100                                                  # the ignore index, spelled out
    assert trace(model, toks, names=[], targets=full).loss == pytest.approx(nll[5], rel=1e-12)
    for kw, match in [(dict(loss_at=-1), "pass targets= too"),
                      (dict(targets=targets, loss_at=6), r"loss_at \[6\] out of range"),
                      (dict(targets=targets[:3], loss_at=-1), r"targets of shape \(3,\) match neither"),
                      (dict(targets=targets, loss_at=[1, -5]), "a position twice")]:
        with pytest.raises(ValueError, match=match):
            trace(model, toks, **kw)


def test_asking_a_gradient_of_a_trace_without_targets_says_to_pass_them(model):
    t = trace(model, ids(3), names="embed")
    with pytest.raises(ValueError, match=r"made without a loss; pass targets= to trace\(\)"):
        t.grad("embed")


# ----------------------------------------------------------------------------
# Logit lens, decomposition, attribution: the parts add up
# ----------------------------------------------------------------------------

def test_logit_lens_rows_are_the_final_norm_and_unembedding_of_each_stream(model):
    toks = ids(7, 9)
    lens = logit_lens(model, toks)
    assert lens.shape == (L + 1, 7, TINY.vocab_size) and lens.dims == ("stream", "position", "token")
    t = trace(model, toks, names=["resid_pre", "norm.in", "logits", "embed"])
    np.testing.assert_allclose(lens[-1], t.get("logits"), rtol=0, atol=1e-10)
    g, W = model.norm.weight.data, model.output.weight.data
    for i in range(L):
        x = t.get("resid_pre", layer=i)
        want = (x / np.sqrt((x ** 2).mean(-1, keepdims=True) + TINY.norm_eps) * g) @ W.T
        np.testing.assert_allclose(lens[i], want, rtol=0, atol=1e-10)
    np.testing.assert_array_equal(t.get("resid_pre", layer=0), t.get("embed"))


def test_parts_sum_to_the_stream_and_attributions_to_the_logit_difference(model):
    toks = ids(7, 10)
    parts = decompose(model, toks)
    assert parts.labels[0] == ["embed"] + [f"L0H{h}" for h in range(H)] + ["L0 MLP"] + \
        [f"L1H{h}" for h in range(H)] + ["L1 MLP"]
    t = trace(model, toks, names=["norm.in", "norm.rms", "logits"])
    np.testing.assert_allclose(np.asarray(parts).sum(0), t.get("norm.in"), rtol=0, atol=1e-10)
    answer, wrong = ids(7, 11), 3
    attrs = logit_attrs(model, toks, answer, wrong)
    logits = t.get("logits")
    diff = logits[np.arange(7), answer] - logits[:, wrong]
    np.testing.assert_allclose(np.asarray(attrs).sum(0), diff, rtol=0, atol=1e-10)
    np.testing.assert_allclose(attrs.baseline["total"], diff, rtol=0, atol=1e-12)
    # One part by hand: head 2 of layer 1 at position 4, the final norm's scale frozen.
    g, W = model.norm.weight.data, model.output.weight.data
    part = np.asarray(parts)[1 + (H + 1) + 2, 4]
    want = (part / t.get("norm.rms")[4] * g) @ (W[answer[4]] - W[wrong])
    assert attrs.sel(component="L1H2")[4] == pytest.approx(want, rel=1e-12)
    with pytest.raises(ValueError, match="answer gives 3 ids for 7 positions"):
        logit_attrs(model, toks, [1, 2, 3])
    with pytest.raises(ValueError, match=r"wrong id 999 is out of range \[0, 53\)"):
        logit_attrs(model, toks, 1, 999)


# ----------------------------------------------------------------------------
# Patching sweeps: batched, equal to one Patch per cell
# ----------------------------------------------------------------------------

def _one_by_one(model, clean, corrupt, name, metric, **where):
    source = trace(model, clean, names=name)
    logits = trace(model, corrupt, names="logits", interventions=Patch(name, source, **where)).get("logits")
    return float(metric(logits[None])[0])


def test_sweeps_equal_one_patch_per_cell(model):
    from glassllm.trace import patching

    clean, corrupt = ids(5, 12), ids(5, 12)
    corrupt[1] = (corrupt[1] + 7) % TINY.vocab_size
    metric = patching.logit_diff(4, 9)
    sweep = patching.layer_position(model, clean, corrupt, metric=metric, max_batch=3)   # two chunks per layer
    assert sweep.dims == ("layer", "position") and sweep.shape == (L, 5)
    for layer in range(L):
        for p in range(5):
            want = _one_by_one(model, clean, corrupt, f"layers.{layer}.resid_pre", metric, positions=[p])
            assert sweep[layer, p] == pytest.approx(want, rel=1e-10, abs=1e-12)
    # Before the changed token nothing differs; patching the whole stream at layer 0 restores the clean run.
    np.testing.assert_allclose(sweep[:, 0], sweep.baseline["corrupt"], rtol=1e-10)
    assert sweep.baseline["clean"] != pytest.approx(sweep.baseline["corrupt"])
    by_head = patching.heads(model, clean, corrupt, metric=metric)
    by_cell = patching.head_position(model, clean, corrupt, metric=metric)
    assert by_head.shape == (L, H) and by_cell.shape == (L, H, 5)
    for layer in range(L):
        for h in range(H):
            want = _one_by_one(model, clean, corrupt, f"layers.{layer}.attn.mix", metric, heads=[h])
            assert by_head[layer, h] == pytest.approx(want, rel=1e-10, abs=1e-12)
            want = _one_by_one(model, clean, corrupt, f"layers.{layer}.attn.mix", metric, heads=[h], positions=[3])
            assert by_cell[layer, h, 3] == pytest.approx(want, rel=1e-10, abs=1e-12)
    assert by_cell.argmax().keys() == {"layer", "head", "position"}


def test_sweep_inputs_are_checked(model):
    from glassllm.trace import patching

    with pytest.raises(ValueError, match="same length"):
        patching.layer_position(model, ids(4), ids(5))
    with pytest.raises(ValueError, match="both predict token"):
        patching.layer_position(model, ids(4), ids(4))
    with pytest.raises(ValueError, match="has no head axis"):
        patching.heads(model, ids(4, 1), ids(4, 2), name="resid_pre", metric=patching.logit_diff(1, 2))


# ----------------------------------------------------------------------------
# The name map
# ----------------------------------------------------------------------------

def test_the_name_map_covers_every_snapshot_and_is_the_documented_table():
    from pathlib import Path

    from glassllm.trace import registry
    from glassllm.trace.names import name_map_table, transformer_lens_name
    from glassllm.trace.registry import NAME_MAP_BEGIN

    hooks = {name: transformer_lens_name(name) for name in registry(TINY)}
    assert hooks["layers.1.attn.head_out"] == "blocks.1.attn.hook_result" and hooks["embed"] == "hook_embed"
    assert sorted(k.split(".", 2)[-1] for k, v in hooks.items() if v is None and k.startswith("layers.0.")) == \
        ["attn.cache_k", "attn.cache_v", "attn.mask", "mlp.act"]
    for bad in ["layers.0.embed", "attn.softmax", "layers.x.attn.q", "nope"]:
        with pytest.raises(ValueError, match="no snapshot is named"):
            transformer_lens_name(bad)
    page = (Path(__file__).resolve().parents[1] / "docs" / "snapshots.md").read_text(encoding="utf-8")
    assert page.split(NAME_MAP_BEGIN, 1)[1].split("<!-- END GENERATED -->", 1)[0] == "\n" + name_map_table()


# ----------------------------------------------------------------------------
# Circuits: the matrices rebuild the forward's own numbers
# ----------------------------------------------------------------------------

def test_ov_and_qk_rebuild_head_out_and_the_scores(model):
    from glassllm.trace import circuits

    t = trace(model, ids(9, 13), names=["attn_norm.out", "attn.softmax", "attn.scores", "attn.head_out"])
    for layer in (0, -1):
        x = t.get("attn_norm.out", layer=layer)                        # (n, C)
        for h in range(H):
            want = t.get("attn.softmax", layer=layer, head=h) @ x @ circuits.ov(model, layer, h)
            np.testing.assert_allclose(t.get("attn.head_out", layer=layer, head=h), want, rtol=0, atol=1e-10)
            scores = t.get("attn.scores", layer=layer, head=h)
            for i, j in [(0, 0), (5, 2), (8, 0), (8, 7)]:
                got = x[i] @ circuits.qk(model, layer, h, offset=i - j) @ x[j]
                assert got == pytest.approx(scores[i, j], rel=1e-10, abs=1e-12)
    with pytest.raises(ValueError, match="offset must be an int in 0..23"):
        circuits.qk(model, 0, 0, offset=-1)


def test_copying_score_is_plus_one_for_a_copying_head_and_minus_one_for_its_negative(model):
    from glassllm.nn import Transformer
    from glassllm.trace import circuits

    # Make head 0 of layer 0 copy: with U = E, norm gains 1 and W_V = W_O.T = P, the first D right
    # singular vectors of E, the full circuit is E P.T P E.T, positive semi-definite: every
    # eigenvalue >= 0, score 1. With W_O negated, every eigenvalue <= 0: score -1.
    m = Transformer(TINY, seed=0, dtype=np.float64)
    state = {k: v.copy() for k, v in model.state_dict().items()}
    E = state["tok_embeddings.weight"]
    state["output.weight"] = E.copy()
    state["norm.weight"] = np.ones(C)
    state["layers.0.attention_norm.weight"] = np.ones(C)
    _, _, vt = np.linalg.svd(E, full_matrices=False)
    state["layers.0.attention.wv.weight"][:D] = vt[:D]                 # kv head 0
    state["layers.0.attention.wo.weight"][:, :D] = vt[:D].T             # query head 0
    m.load_state_dict(state)
    assert circuits.copying_score(m, 0, 0) == pytest.approx(1.0, abs=1e-9)
    state["layers.0.attention.wo.weight"][:, :D] = -vt[:D].T
    m.load_state_dict(state)
    assert circuits.copying_score(m, 0, 0) == pytest.approx(-1.0, abs=1e-9)
    scores = circuits.copying_scores(model)
    assert scores.shape == (L, H) and np.all(np.abs(np.asarray(scores)) <= 1 + 1e-12)


def test_labelled_results_select_and_plot_their_own_numbers(model):
    pytest.importorskip("matplotlib")
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from glassllm.trace import Labelled

    x = Labelled(np.array([[1.0, -2.0, 3.0], [0.5, 0.0, -1.0]]), ("layer", "position"), [[0, 1], ["a", "b", "a"]],
                 "demo")
    assert x.sel(layer=1).labels == [["a", "b", "a"]] and list(x.sel(layer=1)[:]) == [0.5, 0.0, -1.0]
    assert x.sel(position="b").values.tolist() == [-2.0, 0.0] and x.argmax() == {"layer": 0, "position": "a"}
    with pytest.raises(ValueError, match="position='a' matches 2 labels"):
        x.sel(position="a")
    with pytest.raises(ValueError, match="no axis named 'head'"):
        x.sel(head=0)
    image = x.plot()
    np.testing.assert_array_equal(image.get_array(), np.asarray(x))
    assert image.get_clim() == (-3.0, 3.0)                          # signed: symmetric around 0
    assert [t.get_text() for t in image.axes.get_xticklabels()] == ["a", "b", "a"]
    bars = x.sel(layer=0).plot()
    assert [b.get_height() for b in bars] == [1.0, -2.0, 3.0]
    with pytest.raises(ValueError, match="plot draws one or two axes"):
        Labelled(np.zeros((1, 1, 1)), "abc", [[0], [0], [0]]).plot()
    plt.close("all")


@pytest.mark.parametrize("window", [(0, 12), (3, 9), (11, 12), range(5, 8)])
def test_a_window_of_the_lens_table_is_those_columns_of_the_logit_lens(model, window):
    from glassllm.trace import lens_top

    toks = ids(12, 3)
    lens = np.asarray(logit_lens(model, toks))                           # (L+1, n, V), every position
    start, stop = (window.start, window.stop) if isinstance(window, range) else window
    cols = lens[:, start:stop]                                           # (L+1, w, V)
    for kept in (None, trace(model, toks, lazy=True)):                   # run here, or read from a trace
        top, prob = lens_top(model, toks, positions=window, trace=kept)
        assert top.shape == prob.shape == (model.config.n_layers + 1, stop - start)
        assert top.labels[1] == list(range(start, stop)) and top.baseline == {"positions": (start, stop), "length": 12}
        np.testing.assert_array_equal(np.asarray(top), cols.argmax(-1))
        e = np.exp(cols - cols.max(-1, keepdims=True))                    # softmax, written out here
        np.testing.assert_allclose(np.asarray(prob), (e / e.sum(-1, keepdims=True)).max(-1), rtol=1e-12)


@pytest.mark.parametrize("window", [(5, 5), (9, 3), (0, 13), (-1, 4), (0.0, 4), (1, 2, 3), "0:4", range(0, 8, 2)])
def test_a_bad_lens_window_is_refused_in_one_line_naming_it(model, window):
    from glassllm.checks import ParameterError
    from glassllm.trace import lens_top

    with pytest.raises(ParameterError, match=r"^positions must be \[start, stop\) with 0 <= start < stop <= 12 "
                                             r"\(the prompt's positions\), got ") as e:
        lens_top(model, ids(12, 3), positions=window)
    assert e.value.param == "positions" and "\n" not in str(e.value)


def test_the_inspector_tables_are_the_lens_and_the_attributions(model):
    from glassllm.trace import direct_attribution, lens_top

    toks = ids(6, 14)
    lens = np.asarray(logit_lens(model, toks))
    top, prob = lens_top(model, toks)
    np.testing.assert_array_equal(np.asarray(top), lens.argmax(-1))
    p = np.exp(lens - lens.max(-1, keepdims=True))
    np.testing.assert_allclose(np.asarray(prob), (p / p.sum(-1, keepdims=True)).max(-1), rtol=1e-12)
    lazy = trace(model, toks, lazy=True)                                 # the streams a lazy trace keeps
    held = lazy.nbytes
    top2, prob2 = lens_top(model, toks, trace=lazy)
    top3, prob3 = lens_top(model, toks, trace=trace(model, toks))       # a full trace's streams, bit for bit
    np.testing.assert_array_equal(np.asarray(top2), np.asarray(top3))
    np.testing.assert_array_equal(np.asarray(prob2), np.asarray(prob3))
    np.testing.assert_array_equal(np.asarray(top2), np.asarray(top))
    np.testing.assert_allclose(np.asarray(prob2), np.asarray(prob), rtol=1e-12)
    assert lazy.nbytes == held                                           # no block computed to read them
    bars = direct_attribution(model, toks, position=-2)
    logits = trace(model, toks, names="logits").get("logits")
    assert bars.baseline["token"] == int(logits[4].argmax()) and bars.baseline["position"] == 4
    np.testing.assert_allclose(np.asarray(bars).sum(), logits[4, bars.baseline["token"]], rtol=0, atol=1e-10)
    np.testing.assert_array_equal(np.asarray(bars), np.asarray(direct_attribution(model, toks, 4,
                                                                                   token=bars.baseline["token"])))
    np.testing.assert_allclose(np.asarray(direct_attribution(model, toks, 1, token=7)),
                               np.asarray(logit_attrs(model, toks, 7))[:, 1], rtol=1e-12, atol=1e-14)
    with pytest.raises(ValueError, match="position=6 is out of range"):
        direct_attribution(model, toks, position=6)


# ----------------------------------------------------------------------------
# Attribution patching and steering
# ----------------------------------------------------------------------------

def test_attribution_is_the_first_order_change_of_every_patched_cell(model):
    """Each cell's attribution equals the derivative of the metric along the straight line from the
    corrupted to the clean values of that cell (a central finite difference, no backward pass)."""
    from glassllm.trace import patching

    clean, corrupt = ids(5, 12), ids(5, 12)
    corrupt[1] = (corrupt[1] + 7) % TINY.vocab_size
    metric = patching.logit_diff(4, 9)
    att = patching.attribution(model, clean, corrupt, metric=metric)
    exact = patching.layer_position(model, clean, corrupt, metric=metric)
    assert att["layer_position"].baseline == pytest.approx(exact.baseline, rel=1e-12)
    assert (att["layer_position"].dims, att["layer_position"].labels) == (exact.dims, exact.labels)
    base = att["layer_position"].baseline["corrupt"]
    a_clean, a_corrupt = trace(model, clean), trace(model, corrupt)
    eps = 1e-5

    def slope(name, cell):
        """d metric / d t at t = 0, where the cell of ``name`` is a + t (a' - a)."""
        step = np.zeros_like(a_clean.get(name))
        step[cell] = (a_clean.get(name) - a_corrupt.get(name))[cell]
        out = []
        for t in (eps, -eps):
            hook = Hook(name, lambda v, ctx, t=t: v + t * step[None])
            logits = trace(model, corrupt, names="logits", interventions=hook).get("logits")
            out.append(float(metric(logits[None])[0]))
        return (out[0] - out[1]) / (2 * eps)

    for layer in range(L):
        for p in range(5):
            want = slope(f"layers.{layer}.resid_pre", (p,))
            assert att["layer_position"][layer, p] - base == pytest.approx(want, rel=1e-6, abs=1e-9)
        for h in range(H):
            want = slope(f"layers.{layer}.attn.mix", (h,))
            assert att["heads"][layer, h] - base == pytest.approx(want, rel=1e-6, abs=1e-9)
            for p in range(5):
                want = slope(f"layers.{layer}.attn.mix", (h, p))
                assert att["head_position"][layer, h, p] - base == pytest.approx(want, rel=1e-6, abs=1e-9)
    assert np.ptp(np.asarray(att["head_position"])) > 1e-3                      # the cells differ
    # Before the changed token nothing differs, so nothing is attributed there, as in the exact sweep.
    np.testing.assert_allclose(att["layer_position"][:, 0], base, rtol=0, atol=1e-12)
    assert [p.grad for p in model.parameters()] == [None] * len(model.parameters())


def test_attribution_checks_its_metric(model):
    from glassllm.trace import patching

    with pytest.raises(ValueError, match="must give one number as a glassllm Tensor.*got ndarray"):
        patching.attribution(model, ids(4, 1), ids(4, 2), metric=lambda logits: np.zeros(1))
    with pytest.raises(ValueError, match="needs a head axis"):
        patching.attribution(model, ids(4, 1), ids(4, 2), head="resid_pre", metric=patching.logit_diff(1, 2))


def test_steer_adds_its_vector_and_scale_zero_changes_nothing(model):
    from glassllm.trace import Steer

    vector = np.random.default_rng(8).normal(size=C)
    name, x = "layers.1.resid_pre", ids(6, 3)
    plain = trace(model, x, names=name)
    still = trace(model, x, names=name, interventions=Steer(name, vector, 0.0))
    np.testing.assert_array_equal(still.logits, plain.logits)
    steered = trace(model, x, names=name, interventions=Steer(name, vector, 2.5))
    edited = trace(model, x, names=name, interventions=Edit(name, lambda a: a + 2.5 * vector))
    np.testing.assert_array_equal(steered.logits, edited.logits)
    np.testing.assert_array_equal(steered.get(name), plain.get(name) + 2.5 * vector)
    assert np.abs(steered.logits - plain.logits).max() > 1e-3
    # Unlike an Edit, the sum keeps the graph: the earlier layers still get their gradient.
    targets = np.roll(x, -1)
    g = trace(model, x, names=["layers.0.attn.mix", "logits"], targets=targets, interventions=Steer(name, vector, 2.5))
    cut = trace(model, x, names=["layers.0.attn.mix", "logits"], targets=targets,
                interventions=Edit(name, lambda a: a + 2.5 * vector))
    assert np.abs(g.grad("attn.mix", layer=0)).max() > 1e-6 and not cut.grad("attn.mix", layer=0).any()
    with pytest.raises(ValueError, match=r"has axes \('H', 'n', 'D'\), expected \(n, C\)"):
        trace(model, x, interventions=Steer("layers.0.attn.mix", vector))
    with pytest.raises(ValueError, match=f"the model's width C={C}, got shape \\(3,\\)"):
        trace(model, x, interventions=Steer(name, [1.0, 2.0, 3.0]))
    with pytest.raises(ValueError, match="scale must be a finite number"):
        Steer(name, vector, float("nan"))


def test_steering_reaches_every_generated_token(model):
    """Greedy decoding under Steer (KV cache, one new position per step) equals recomputing the whole
    steered sequence at every step without a cache."""
    from glassllm.generate import generate
    from glassllm.trace import Steer

    vector = np.random.default_rng(9).normal(size=C) * 3.0
    steer = Steer("layers.1.resid_mid", vector, 1.5)
    prompt = [int(i) for i in ids(4, 6)]
    with Tracer(model, names=[], interventions=steer):
        steered = [t.id for t in generate(model, None, prompt, max_new_tokens=8, temperature=0)]
    seq = list(prompt)
    for _ in range(8):
        seq.append(int(trace(model, seq, names=[], interventions=steer).logits[-1].argmax()))
    assert steered == seq[len(prompt):]
    plain = [t.id for t in generate(model, None, prompt, max_new_tokens=8, temperature=0)]
    assert plain != steered
    with Tracer(model, names=[], interventions=Steer("layers.1.resid_mid", vector, 0)):
        assert [t.id for t in generate(model, None, prompt, max_new_tokens=8, temperature=0)] == plain
