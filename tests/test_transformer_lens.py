"""glassllm's interpretability tools against TransformerLens itself (float32, 1e-4).

A small random glassllm model is written to a temporary folder, exported as a
Hugging Face Llama (``glassllm export ... --format hf``), and loaded by
TransformerLens' ``TransformerBridge.boot_transformers`` from that folder (no
hub): once with its weights unprocessed, once with the norms folded into the
next matrices (what its logit lens and ``logit_attrs`` expect). On two prompts:

- every snapshot with a TransformerLens counterpart (``transformer_lens_name``)
  holds that hook's numbers, after ``to_transformer_lens``'s layout change --
  ``attn.head_out`` against ``hook_result`` among them;
- ``logit_lens`` against ``accumulated_resid(apply_ln=True) @ W_U``;
- ``logit_attrs`` against ``cache.logit_attrs`` on the stack of the embedding,
  ``stack_head_results`` and the MLP outputs;
- a layer x position patching sweep against the same sweep with TransformerLens hooks;
- a ``Hook`` under backward against a TransformerLens hook under backward;
- the trace read as TransformerLens' cache: ``trace[hook]`` for every hook name, in TransformerLens'
  layout by ``as_transformer_lens``, and ``names=`` given TransformerLens names or a hook filter;
- attribution patching against the same first-order estimate from TransformerLens' hooks and PyTorch's
  backward;
- ``show_attention`` on TransformerLens' ``cache["pattern", 0]`` in Chromium: the hovered cells read
  the tensor's values.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformer_lens")

from glassllm import checkpoint, cli  # noqa: E402
from glassllm.config import ModelConfig  # noqa: E402
from glassllm.nn import Transformer  # noqa: E402
from glassllm.tokenizer import Tokenizer  # noqa: E402
from glassllm.trace import Hook, Tracer, logit_attrs, logit_lens, patching, registry, trace  # noqa: E402
from glassllm.trace.names import to_transformer_lens, transformer_lens_name  # noqa: E402
from tests.support.glassllm_testing import randomize  # noqa: E402
from tests.test_inspector_browser import browser  # noqa: E402,F401  (a fixture)

CONFIG = ModelConfig(vocab_size=270, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64)
PROMPTS = ["the cat sat on the mat. the cat", "the dog ran to the cat, and the dog sat"]
TOL = dict(rtol=1e-4, atol=1e-4)


@pytest.fixture(scope="module")
def ours(tmp_path_factory):
    """(model, tokenizer, Hugging Face folder): a random model written and exported through the CLI."""
    folder = tmp_path_factory.mktemp("tl")
    tok = Tokenizer.train(["the cat sat on the mat. the dog ran to the cat. " * 20], vocab_size=CONFIG.vocab_size)
    model = randomize(Transformer(CONFIG, seed=0), np.random.default_rng(1))
    checkpoint.save_model(folder / "tiny.safetensors", model, tok)
    assert cli.main(["export", str(folder / "tiny.safetensors"), "--format", "hf", str(folder / "hf")]) == 0
    return model, tok, folder / "hf"


def _boot(folder, **compat):
    from transformer_lens.model_bridge import TransformerBridge

    bridge = TransformerBridge.boot_transformers(str(folder), device="cpu", dtype=torch.float32)
    bridge.enable_compatibility_mode(disable_warnings=True, **compat)
    bridge.set_use_attn_result(True)
    return bridge


@pytest.fixture(scope="module")
def raw(ours):
    """The bridge with its weights as exported."""
    return _boot(ours[2], no_processing=True)


@pytest.fixture(scope="module")
def folded(ours):
    """The bridge with the norms' gains folded into the next matrices (no centering: RMSNorm has no mean)."""
    return _boot(ours[2], fold_ln=True, center_writing_weights=False, center_unembed=False)


def _ids(tok, text):
    return np.array(tok.encode(text, allowed_special="all"))


def _np(x):
    return x.detach().double().numpy()


@pytest.mark.parametrize("text", PROMPTS)
def test_every_counterpart_holds_the_same_numbers(ours, raw, text):
    model, tok, _ = ours
    ids = _ids(tok, text)
    _, cache = raw.run_with_cache(torch.tensor(ids[None]))
    t = trace(model, ids)
    missing = []
    for name in registry(model):
        hook = transformer_lens_name(name)
        if hook is None:
            missing.append(name.split(".", 2)[-1])
            continue
        mask = t.get(name.replace("scores", "mask")) if name.endswith("attn.scores") else None
        # The same numbers three ways: converted by hand, read from the trace under the hook's name
        # (the alias reads the very same array), and in TransformerLens' layout, batch axis kept.
        by_hand = to_transformer_lens(name, t.get(name), mask)
        assert hook in t and t[hook] is t[name]
        got = t.as_transformer_lens(hook)
        np.testing.assert_array_equal(got[0], by_hand)
        want = _np(cache[hook])
        assert got.shape == want.shape, name
        np.testing.assert_array_equal(np.isfinite(got), np.isfinite(want), err_msg=name)
        np.testing.assert_allclose(got[np.isfinite(got)], want[np.isfinite(want)], **TOL, err_msg=name)
    assert sorted(set(missing)) == ["attn.cache_k", "attn.cache_v", "attn.mask", "mlp.act", "probs"]
    for i in range(CONFIG.n_layers):                                   # the short names of cache[...]
        np.testing.assert_allclose(t["pattern", i], _np(cache["pattern", i][0]), **TOL)
        np.testing.assert_allclose(t.as_transformer_lens("z", layer=i), _np(cache["z", i]), **TOL)
    # head_out against hook_result, and its sum over the heads against the attention output.
    for i in range(CONFIG.n_layers):
        result = _np(cache[f"blocks.{i}.attn.hook_result"][0])        # (n, H, C)
        np.testing.assert_allclose(t.get("attn.head_out", layer=i), result.transpose(1, 0, 2), **TOL)
        np.testing.assert_allclose(t.get("attn.head_out", layer=i).sum(0), t.get("attn.out", layer=i),
                                   rtol=0, atol=1e-5)


@pytest.mark.parametrize("text", PROMPTS)
def test_logit_lens_and_attributions_match(ours, folded, text):
    model, tok, _ = ours
    ids = _ids(tok, text)
    n, L, H = len(ids), CONFIG.n_layers, CONFIG.n_heads
    logits, cache = folded.run_with_cache(torch.tensor(ids[None]))
    acc, labels = cache.accumulated_resid(apply_ln=True, return_labels=True)   # (L+1, 1, n, C)
    want = _np(acc[:, 0] @ folded.W_U)                                          # (L+1, n, V)
    lens = logit_lens(model, ids)
    assert len(labels) == lens.shape[0] == L + 1
    np.testing.assert_allclose(np.asarray(lens), want, **TOL)
    np.testing.assert_allclose(lens[-1], _np(logits[0]), **TOL)

    # Direct attribution of every part to answer - wrong at every position.
    parts, part_labels = cache.decompose_resid(return_labels=True)              # embed, attn_out, mlp_out ...
    heads, head_labels = cache.stack_head_results(layer=-1, return_labels=True)  # L0H0 ...
    stack = [parts[0]]
    for i in range(L):
        stack += list(heads[i * H:(i + 1) * H]) + [parts[part_labels.index(f"{i}_mlp_out")]]
    answer = np.roll(ids, -1)                                                   # the next token (wrapped)
    wrong = (ids * 7 + 3) % CONFIG.vocab_size
    theirs = cache.logit_attrs(torch.stack(stack), tokens=torch.tensor(answer[None]),
                               incorrect_tokens=torch.tensor(wrong[None]))       # (K, 1, n)
    attrs = logit_attrs(model, ids, answer, wrong)
    assert attrs.labels[0][1:H + 1] == head_labels[:H]
    np.testing.assert_allclose(np.asarray(attrs), _np(theirs[:, 0]), **TOL)
    np.testing.assert_allclose(np.asarray(attrs).sum(0), attrs.baseline["total"], rtol=0, atol=1e-4)


def _pair(tok):
    """A clean prompt, the same with token 2 changed, and the metric's answer and wrong token."""
    clean = _ids(tok, PROMPTS[0])
    corrupt = clean.copy()
    corrupt[2] = (clean[2] + 1) % CONFIG.vocab_size
    return clean, corrupt, int(clean[1]), int(clean[4])


def test_layer_position_sweep_matches_transformer_lens_hooks(ours, raw):
    model, tok, _ = ours
    clean, corrupt, answer, wrong = _pair(tok)
    sweep = patching.layer_position(model, clean, corrupt, metric=patching.logit_diff(answer, wrong))
    _, cache = raw.run_with_cache(torch.tensor(clean[None]))
    want = np.zeros(sweep.shape)
    for layer in range(CONFIG.n_layers):
        hook = f"blocks.{layer}.hook_resid_pre"
        for p in range(len(clean)):
            def put_back(act, hook=None, p=p, clean_act=cache[hook][:, p].clone()):
                act = act.clone()
                act[:, p] = clean_act
                return act
            with torch.no_grad():
                logits = raw.run_with_hooks(torch.tensor(corrupt[None]), fwd_hooks=[(hook, put_back)])
            want[layer, p] = float(logits[0, -1, answer] - logits[0, -1, wrong])
    assert np.ptp(want) > 1e-2                                       # the cells differ: a real comparison
    np.testing.assert_allclose(np.asarray(sweep), want, **TOL)
    # The same sweep named by TransformerLens' hook, as a glob over the blocks or by its short name.
    for name in ("blocks.*.hook_resid_pre", "hook_resid_pre"):
        again = patching.layer_position(model, clean, corrupt, name=name, metric=patching.logit_diff(answer, wrong))
        np.testing.assert_array_equal(np.asarray(again), np.asarray(sweep), err_msg=name)
    with pytest.raises(ValueError, match=r"name must be layer-local .* got 'blocks.0.hook_resid_pre'$"):
        patching.layer_position(model, clean, corrupt, name="blocks.0.hook_resid_pre")


def test_a_hook_under_backward_matches_a_transformer_lens_hook(ours, raw):
    model, tok, _ = ours
    ids = _ids(tok, PROMPTS[1])
    targets = np.roll(ids, -1)
    scale = np.array([1.0, 0.5, -2.0, 1.5], dtype=np.float32)

    # glassllm: scale each head's output before W_O; gradients flow through the hook.
    hook = Hook("layers.0.attn.mix", lambda v, ctx: v * scale[:, None, None])
    t = trace(model, ids, names=["embed", "layers.0.attn.v", "logits"], targets=targets, interventions=hook)

    # TransformerLens: the same on hook_z, with the embedding's and v's gradients kept.
    kept = {}

    def keep(act, hook):
        act.retain_grad()
        kept[hook.name] = act
        return act

    def scale_z(z, hook):
        return z * torch.tensor(scale)[None, None, :, None]                    # (B, n, H, D)

    logits = raw.run_with_hooks(torch.tensor(ids[None]), fwd_hooks=[
        ("hook_embed", keep), ("blocks.0.attn.hook_v", keep), ("blocks.0.attn.hook_z", scale_z)])
    loss = torch.nn.functional.cross_entropy(logits[0], torch.tensor(targets))
    loss.backward()
    assert t.loss == pytest.approx(float(loss.detach()), rel=1e-5)
    np.testing.assert_allclose(t.get("logits"), _np(logits[0]), **TOL)
    np.testing.assert_allclose(t.grad("embed"), _np(kept["hook_embed"].grad[0]), rtol=1e-4, atol=1e-6)
    np.testing.assert_allclose(t.grad("attn.v", layer=0), _np(kept["blocks.0.attn.hook_v"].grad[0]).swapaxes(0, 1),
                               rtol=1e-4, atol=1e-6)
    assert np.abs(t.grad("attn.v", layer=0)).max() > 1e-4           # the hook did not cut the graph

    # The same numbers from glassllm's float64 path, at 1e-10: the hooked loss's gradient
    # equals the gradient of the same model with head scaling folded into W_O.
    model64 = Transformer(CONFIG, seed=0, dtype=np.float64)
    model64.load_state_dict(model.state_dict())
    t64 = trace(model64, ids, names=["embed"], targets=targets,
                interventions=Hook("layers.0.attn.mix", lambda v, ctx: v * scale[:, None, None].astype(np.float64)))
    state = {k: v.astype(np.float64) for k, v in model.state_dict().items()}
    D = CONFIG.head_dim
    state["layers.0.attention.wo.weight"] = state["layers.0.attention.wo.weight"] * np.repeat(scale, D)[None, :]
    folded_model = Transformer(CONFIG, seed=0, dtype=np.float64)
    folded_model.load_state_dict(state)
    with Tracer(folded_model, names=["embed"]) as tracer:
        folded_model.loss(ids, targets).backward()
    np.testing.assert_allclose(t64.grad("embed"), tracer.trace.grad("embed"), rtol=1e-10, atol=1e-13)


def test_names_take_transformer_lens_hooks_and_a_hook_filter(ours, raw):
    model, tok, _ = ours
    ids = _ids(tok, PROMPTS[0])
    _, cache = raw.run_with_cache(torch.tensor(ids[None]))
    # names= takes TransformerLens names and a hook filter, and records what they name.
    only = trace(model, ids, names=["blocks.*.attn.hook_pattern", "hook_embed"])
    assert list(only) == ["embed"] + [f"layers.{i}.attn.softmax" for i in range(CONFIG.n_layers)]
    filtered = trace(model, ids, names=lambda hook: hook.endswith("hook_resid_post"))
    assert list(filtered) == [f"layers.{i}.resid_post" for i in range(CONFIG.n_layers)]
    theirs = [k for k in cache if k.endswith("hook_resid_post")]
    assert [transformer_lens_name(k) for k in filtered] == theirs
    # A hook name with its block and layer= must agree, as a glassllm name must; a glob takes the layer.
    t = trace(model, ids)
    np.testing.assert_allclose(t.get("blocks.*.attn.hook_pattern", layer=1),
                               cache["blocks.1.attn.hook_pattern"][0].numpy(), **TOL)
    assert t.name("blocks.1.attn.hook_pattern", layer=1) == t.name("layers.*.attn.softmax", layer=1) == \
        "layers.1.attn.softmax"
    for name in ("blocks.1.attn.hook_pattern", "layers.1.attn.softmax"):
        with pytest.raises(ValueError, match=f"'{name}' names another layer than layer=0"):
            t.get(name, layer=0)


@pytest.mark.browser
def test_show_attention_draws_transformer_lens_pattern_and_hovers_its_values(ours, raw, browser, tmp_path):
    import glassllm
    from tests.test_inspector_browser import hover, idle, pick

    model, tok, _ = ours
    ids = _ids(tok, PROMPTS[1])
    _, cache = raw.run_with_cache(torch.tensor(ids[None]))
    pattern = cache["pattern", 0]                                        # (1, H, n, n), a torch tensor
    tokens = tok.pieces(ids.tolist())
    path = tmp_path / "attention.html"
    glassllm.show_attention(pattern[0], tokens).save(path)
    want = _np(pattern[0]).astype(np.float32)                            # what the tensor holds
    n = len(ids)
    page = browser.new_page()
    errors = []
    page.on("pageerror", lambda e: errors.append(str(e)))
    try:
        page.goto(path.as_uri())
        page.wait_for_function("() => window.glass && window.glass.ready === true && window.glass.heatmap",
                               timeout=60_000)
        for head, (i, j) in [(0, (n - 1, 3)), (2, (5, 5)), (3, (n - 1, 0))]:
            pick(page, 0, "attn.softmax", head)
            tip = hover(page, i, j)
            assert (tip["row"], tip["col"]) == (i, j)
            assert float(tip["value"]) == float(want[head, i, j]) and want[head, i, j] > 0
            assert repr(tokens[i]).strip("'") in tip["text"] or tokens[i].strip() in tip["text"]
        shown = page.evaluate("() => Array.from(window.glass.heatmap.values)")
        np.testing.assert_array_equal(np.array(shown, dtype=np.float32).reshape(n, n), want[3])
        page.evaluate("() => window.glass.tab('heads')")                  # the head grid: every head at once
        idle(page)
        assert page.is_hidden("#grid-error")
        grid = np.array(page.evaluate("() => Array.from(window.glass.grid.values)"), dtype=np.float32)
        # The head grid's weights travel as float16 (the page only draws them): the nearest float16, exactly.
        np.testing.assert_array_equal(grid.reshape(CONFIG.n_heads, n, n), want.astype(np.float32).astype(np.float16))
        line = page.locator("#model-line").inner_text()
        assert line.startswith("attention weights given as arrays: 1 layer") and f"{n} tokens" in line
    finally:
        page.close()
    assert not errors, errors


def test_attribution_patching_matches_the_same_first_order_estimate_in_transformer_lens(ours, raw):
    """(clean - corrupted activation) x d metric / d activation in the corrupted run, summed per cell, with
    TransformerLens' hooks and PyTorch's backward: resid_pre per layer and position, hook_z per head and position."""
    model, tok, _ = ours
    clean, corrupt, answer, wrong = _pair(tok)
    att = patching.attribution(model, clean, corrupt, metric=patching.logit_diff(answer, wrong))
    base = att["layer_position"].baseline["corrupt"]

    _, clean_cache = raw.run_with_cache(torch.tensor(clean[None]))
    kept = {}

    def keeper(name):
        def keep(act, hook):
            act.retain_grad()
            kept[name] = act
            return act
        return keep

    hooks = [(name, keeper(name)) for i in range(CONFIG.n_layers)
             for name in (f"blocks.{i}.hook_resid_pre", f"blocks.{i}.attn.hook_z")]
    logits = raw.run_with_hooks(torch.tensor(corrupt[None]), fwd_hooks=hooks)
    metric = logits[0, -1, answer] - logits[0, -1, wrong]
    metric.backward()
    assert base == pytest.approx(float(metric.detach()), rel=1e-4)
    resid = np.stack([_np((clean_cache[f"blocks.{i}.hook_resid_pre"] - kept[f"blocks.{i}.hook_resid_pre"])
                          * kept[f"blocks.{i}.hook_resid_pre"].grad)[0].sum(-1) for i in range(CONFIG.n_layers)])
    z = np.stack([_np((clean_cache[f"blocks.{i}.attn.hook_z"] - kept[f"blocks.{i}.attn.hook_z"])
                      * kept[f"blocks.{i}.attn.hook_z"].grad)[0].sum(-1).T for i in range(CONFIG.n_layers)])  # (L, H, n)
    assert np.ptp(resid) > 1e-2
    np.testing.assert_allclose(np.asarray(att["layer_position"]) - base, resid, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(np.asarray(att["head_position"]) - base, z, rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(np.asarray(att["heads"]) - base, z.sum(-1), rtol=1e-3, atol=1e-4)
