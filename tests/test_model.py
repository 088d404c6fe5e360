"""The whole model against an independent PyTorch LLaMA, plus the KV cache, masks and bad input.

The reference (``tests/torch_reference.py``) never imports glassllm.nn; weights
are copied key for key and everything is compared in float64. Short blocks
take the dense fused attention kernel; blocks of ``FLASH_MIN_QUERIES`` or more
new tokens take the tiled kernel, so a long block is compared too.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from tests.support.glassllm_testing import CONFIGS, TINY, TeachingTracer, need
from glassllm.autograd import no_grad
from glassllm.config import ModelConfig
from glassllm.kernels import FLASH_MIN_QUERIES
from glassllm.nn import Transformer, causal_mask

# Long enough to take the tiled attention kernel.
LONG_N = FLASH_MIN_QUERIES + 9
LONG = ModelConfig(vocab_size=61, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64,
                   max_seq_len=LONG_N + 16)


def _tokens_and_targets(config, rng, batch, n):
    tokens = rng.integers(0, config.vocab_size, (batch, n))
    targets = rng.integers(0, config.vocab_size, (batch, n))
    targets[0, 1] = targets[-1, -3] = -100          # ignored positions count neither in sum nor mean
    return tokens, targets


def _compare_with_torch(model, tokens, targets):
    torch_reference = need("tests.support.torch_reference")                    # a skip (CI: a failure) naming torch
    ref = torch_reference.TorchLlama(model.config.to_dict())
    ref.load_glassllm_state(model.state_dict())

    logits = model(tokens).data
    expected = ref(tokens).detach().numpy()
    assert logits.shape == expected.shape
    np.testing.assert_allclose(logits, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())

    model.zero_grad()
    loss = model.loss(tokens, targets)
    loss.backward()
    ref_loss = ref.loss(tokens, targets)
    ref_loss.backward()
    assert loss.item() == pytest.approx(ref_loss.item(), rel=1e-10)
    ref_grads = ref.grads()
    assert set(ref_grads) == set(model.state_dict())
    for name, p in model.named_parameters():
        g = ref_grads[name]
        assert p.grad is not None, f"{name} received no gradient"
        # Relative to the parameter's largest gradient entry.
        np.testing.assert_allclose(p.grad, g, rtol=1e-5, atol=1e-5 * np.abs(g).max(), err_msg=name)


# ----------------------------------------------------------------------------
# The model against PyTorch
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", list(CONFIGS))
def test_logits_and_gradients_match_torch(name, make_model, rng):
    pytest.importorskip("torch")
    config = CONFIGS[name]
    model = make_model(config, seed=3)
    tokens, targets = _tokens_and_targets(config, rng, batch=2, n=17)
    _compare_with_torch(model, tokens, targets)


def test_long_block_matches_torch(make_model, rng):
    pytest.importorskip("torch")
    model = make_model(LONG, seed=4)
    tokens, targets = _tokens_and_targets(LONG, rng, batch=2, n=LONG_N)
    _compare_with_torch(model, tokens, targets)


def test_reference_fused_attention_mode_agrees(make_model, rng):
    """The benchmark's ``attention="sdpa"`` twin computes the same logits as the spelled-out one."""
    pytest.importorskip("torch")
    torch_reference = pytest.importorskip("tests.support.torch_reference")
    model = make_model(CONFIGS["mqa"], seed=14)
    tokens = rng.integers(0, model.config.vocab_size, (2, 9))
    logits = []
    for attention in ("explicit", "sdpa"):
        ref = torch_reference.TorchLlama(model.config.to_dict(), attention=attention)
        ref.load_glassllm_state(model.state_dict())
        logits.append(ref(tokens).detach().numpy())
    np.testing.assert_allclose(logits[0], logits[1], rtol=1e-12, atol=1e-12)


def test_float32_model_stays_float32_and_close_to_float64(make_model, rng):
    pytest.importorskip("torch")
    torch_reference = pytest.importorskip("tests.support.torch_reference")
    model64 = make_model(TINY, seed=5)
    model32 = make_model(TINY, seed=5, dtype=np.float32)
    tokens, targets = _tokens_and_targets(TINY, rng, batch=2, n=11)
    logits = model32(tokens)
    assert logits.dtype == np.float32
    loss = model32.loss(tokens, targets)
    assert loss.dtype == np.float32
    loss.backward()
    assert all(p.grad.dtype == np.float32 for p in model32.parameters())
    ref = torch_reference.TorchLlama(TINY.to_dict())
    ref.load_glassllm_state(model64.state_dict())
    expected = ref(tokens).detach().numpy()
    np.testing.assert_allclose(logits.data, expected, rtol=1e-4, atol=1e-4 * np.abs(expected).max())


def test_snapshots_equal_the_reference_intermediates(make_model, rng):
    """Every tensor the teaching path shows equals the reference's value under the same name."""
    pytest.importorskip("torch")
    torch_reference = pytest.importorskip("tests.support.torch_reference")
    model = make_model(CONFIGS["gqa3"], seed=6)
    tokens = rng.integers(0, model.config.vocab_size, (2, 9))
    tracer = TeachingTracer()
    model.set_tracer(tracer)
    model(tokens)
    model.set_tracer(None)
    ref = torch_reference.TorchLlama(model.config.to_dict())
    ref.load_glassllm_state(model.state_dict())
    capture = {}
    ref(tokens, capture=capture)
    alias = {"cache_k": "rope_k", "cache_v": "v"}  # without a cache, the keys read are the new ones
    assert set(tracer.values) == set(model.snapshot_axes())
    for name, value in tracer.values.items():
        head, _, last = name.rpartition(".")
        expected = capture[f"{head}.{alias.get(last, last)}" if head else alias.get(last, last)]
        expected = np.broadcast_to(expected.detach().numpy(), value.shape)
        np.testing.assert_allclose(value, expected, rtol=1e-10, atol=1e-10, err_msg=name)


# ----------------------------------------------------------------------------
# Fast path = teaching path
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("config,n", [(CONFIGS["gqa3"], 13), (LONG, LONG_N)], ids=["short", "long"])
def test_teaching_path_equals_fast_path(config, n, make_model, rng):
    fast = make_model(config, seed=7)
    teach = make_model(config, seed=7)
    tracer = TeachingTracer()
    teach.set_tracer(tracer)
    tokens, targets = _tokens_and_targets(config, rng, batch=2, n=n)
    loss_fast, loss_teach = fast.loss(tokens, targets), teach.loss(tokens, targets)
    assert "layers.0.attn.softmax" in tracer.seen and "layers.0.attn_norm.rms" in tracer.seen
    assert loss_fast.item() == pytest.approx(loss_teach.item(), rel=1e-12)
    loss_fast.backward()
    loss_teach.backward()
    teach_params = dict(teach.named_parameters())
    for name, p in fast.named_parameters():
        np.testing.assert_allclose(p.grad, teach_params[name].grad, rtol=1e-9,
                                   atol=1e-12 * np.abs(p.grad).max(), err_msg=name)
    with no_grad():
        np.testing.assert_allclose(fast(tokens).data, teach(tokens).data, rtol=1e-12, atol=1e-12)


# ----------------------------------------------------------------------------
# KV cache
# ----------------------------------------------------------------------------

def _feed(model, tokens, sizes, cache=None):
    cache = model.new_cache(tokens.shape[0]) if cache is None else cache
    out, at = [], 0
    with no_grad():
        for size in sizes:
            out.append(model(tokens[:, at:at + size], cache=cache).data)
            at += size
    assert cache.start == at == tokens.shape[1]
    return np.concatenate(out, axis=1)


@pytest.mark.parametrize("name", list(CONFIGS))
@pytest.mark.parametrize("sizes", [[1] * 17, [3, 1, 5, 2, 6], [16, 1]], ids=["one_by_one", "uneven", "prompt_then_one"])
def test_kv_cache_equals_full_forward(name, sizes, make_model, rng):
    config = CONFIGS[name]
    model = make_model(config, seed=8)
    tokens = rng.integers(0, config.vocab_size, (2, 17))
    with no_grad():
        full = model(tokens).data
    np.testing.assert_allclose(_feed(model, tokens, sizes), full, rtol=1e-6, atol=1e-6)


def test_kv_cache_long_chunks(make_model, rng):
    model = make_model(LONG, seed=9)
    tokens = rng.integers(0, LONG.vocab_size, (2, LONG_N + 10))
    with no_grad():
        full = model(tokens).data
    for sizes in ([LONG_N, 1, 9], [5, LONG_N, 5]):
        np.testing.assert_allclose(_feed(model, tokens, sizes), full, rtol=1e-6, atol=1e-6)


def test_kv_cache_under_autograd_gives_the_same_logits(make_model, rng):
    model = make_model(TINY, seed=10)
    tokens = rng.integers(0, TINY.vocab_size, (1, 9))
    with no_grad():
        full = model(tokens).data
    cache = model.new_cache(1)
    first = model(tokens[:, :4], cache=cache)
    second = model(tokens[:, 4:], cache=cache)
    assert first.requires_grad and second.requires_grad
    np.testing.assert_allclose(np.concatenate([first.data, second.data], axis=1), full, rtol=1e-10, atol=1e-10)


# ----------------------------------------------------------------------------
# Left padding: a batch of prompts of different lengths
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("config,lengths", [(TINY, [5, 2, 9]), (LONG, [LONG_N, LONG_N - 7])], ids=["short", "long"])
def test_left_padding_gives_each_row_its_own_logits(config, lengths, make_model, rng):
    model = make_model(config, seed=11)
    width = max(lengths)
    pad = np.array([width - n for n in lengths])
    rows = [rng.integers(0, config.vocab_size, n + 3) for n in lengths]  # prompt + 3 decoded tokens
    # Padding slots hold random ids: what sits there must not matter.
    batch = rng.integers(0, config.vocab_size, (len(lengths), width))
    for b, (row, p) in enumerate(zip(rows, pad)):
        batch[b, p:] = row[:lengths[b]]
    cache = model.new_cache(len(lengths), pad=pad)
    with no_grad():
        prompt_logits = model(batch, cache=cache).data                   # (B, width, V)
        steps = [model(np.array([[row[n + s]] for row, n in zip(rows, lengths)]), cache=cache).data
                 for s in range(3)]
    assert np.all(np.isfinite(prompt_logits)), "padded positions (fully masked rows) must not be NaN"
    for b, (row, n, p) in enumerate(zip(rows, lengths, pad)):
        with no_grad():
            alone = model(row[None]).data[0]                              # (n + 3, V)
        np.testing.assert_allclose(prompt_logits[b, p:], alone[:n], rtol=1e-9, atol=1e-9)
        for s in range(3):
            np.testing.assert_allclose(steps[s][b, 0], alone[n + s], rtol=1e-9, atol=1e-9)


# ----------------------------------------------------------------------------
# causal_mask semantics
# ----------------------------------------------------------------------------

def test_causal_mask_over_shapes_and_starts():
    for n in range(0, 6):
        for m in range(0, 8):
            for start in range(0, 5):
                mask = causal_mask(n, m, start)
                assert mask.shape == (n, m) and mask.dtype == np.bool_
                # Reference 1: the definition, entry by entry.
                expected = np.array([[j > start + i for j in range(m)] for i in range(n)], dtype=bool).reshape(n, m)
                np.testing.assert_array_equal(mask, expected, err_msg=f"n={n} m={m} start={start}")
                # Reference 2: strictly above diagonal start of an all-ones matrix.
                np.testing.assert_array_equal(mask, np.triu(np.ones((n, m), dtype=bool), k=start + 1))


def test_causal_mask_hand_examples():
    np.testing.assert_array_equal(causal_mask(3, 3, 0), [[0, 1, 1], [0, 0, 1], [0, 0, 0]])
    # Two new queries at positions 1 and 2 after one cached key.
    np.testing.assert_array_equal(causal_mask(2, 3, 1), [[0, 0, 1], [0, 0, 0]])
    # Decoding one token after four cached ones: it sees all five keys.
    np.testing.assert_array_equal(causal_mask(1, 5, 4), [[0, 0, 0, 0, 0]])
    # Every query has at least one legal key when m = start + n.
    for start in range(4):
        for n in range(1, 5):
            assert not causal_mask(n, start + n, start).all(axis=1).any()


def test_causal_mask_with_padding_and_the_padded_positions():
    from glassllm.positions import positions

    pad = np.array([0, 2, 5])
    for n, start in [(4, 0), (2, 3), (1, 6)]:
        m = start + n
        mask = causal_mask(n, m, start, pad)
        expected = np.array([[[j > start + i or j < p for j in range(m)] for i in range(n)] for p in pad])
        np.testing.assert_array_equal(mask, expected)
        np.testing.assert_array_equal(positions(start, m, pad),
                                      [[max(start + i - p, 0) for i in range(n)] for p in pad])
    np.testing.assert_array_equal(positions(3, 5), [3, 4])


@pytest.mark.parametrize("args", [(-1, 3, 0), (2, -3, 0), (2, 3, -1), (2.0, 3, 0), (True, 3, 0), (2, "3", 0)])
def test_causal_mask_rejects_bad_arguments(args):
    with pytest.raises(ValueError, match=r"causal_mask: \w+ must be an int >= 0, got") as info:
        causal_mask(*args)
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------
# No NaN at the model level
# ----------------------------------------------------------------------------

def _scaled(model, factor, keys=("wq", "wk")):
    state = model.state_dict()
    for name in state:
        if any(f"attention.{k}." in name for k in keys):
            state[name] = state[name] * factor
    model.load_state_dict(state)
    return model


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_huge_scores_stay_finite(dtype, make_model, rng):
    model = _scaled(make_model(TINY, seed=12, dtype=dtype), 50.0)  # scores x 2500
    tracer = TeachingTracer()
    model.set_tracer(tracer)
    tokens, targets = _tokens_and_targets(TINY, rng, batch=2, n=12)
    loss = model.loss(tokens, targets)
    loss.backward()
    scores = tracer.values["layers.0.attn.scores"]
    assert np.abs(scores).max() > 1e3, "the test should push scores to the thousands"
    weights = tracer.values["layers.0.attn.softmax"]
    np.testing.assert_allclose(weights.sum(-1), 1.0, rtol=1e-5)
    assert np.isfinite(loss.item())
    for name, p in model.named_parameters():
        assert np.all(np.isfinite(p.grad)), name


def test_equal_scores_attend_uniformly(make_model, rng):
    """With wq = 0 every score is 0: query i spreads 1/(i+1) over keys 0..i."""
    model = _scaled(make_model(TINY, seed=13), 0.0, keys=("wq",))
    tracer = TeachingTracer()
    model.set_tracer(tracer)
    n = 6
    model(rng.integers(0, TINY.vocab_size, (1, n)))
    expected = np.tril(np.ones((n, n))) / np.arange(1, n + 1)[:, None]
    for layer in range(TINY.n_layers):
        weights = tracer.values[f"layers.{layer}.attn.softmax"]              # (B, H, n, m)
        np.testing.assert_allclose(weights, np.broadcast_to(expected, weights.shape), rtol=1e-12)


# ----------------------------------------------------------------------------
# Bad input: one line that names the value and what was expected
# ----------------------------------------------------------------------------

def _one_line(info):
    assert "\n" not in str(info.value)


@pytest.mark.parametrize("tokens,error,match", [
    (np.array([[1, 53]]), ValueError, r"token id 53 is out of range \[0, 53\)"),
    (np.array([[-1, 2]]), ValueError, r"token id -1 is out of range \[0, 53\)"),
    (np.array([[1.0, 2.0]]), TypeError, r"token ids must be integers, got dtype float64"),
    (np.array([[True, False]]), TypeError, r"integers, got dtype bool"),
    (np.array(["a", "b"]), TypeError, r"integers, got dtype <U1"),
    (np.zeros((1, 2, 3), dtype=np.int64), ValueError, r"shape \(B, n\) or \(n,\), got shape \(1, 2, 3\)"),
    (np.zeros((2, 0), dtype=np.int64), ValueError, r"empty"),
    (np.zeros((1, 25), dtype=np.int64), ValueError, r"25 positions .* exceeds the context length 24"),
])
def test_bad_tokens(tokens, error, match, make_model):
    model = make_model(TINY)
    with pytest.raises(error, match=match) as info:
        model(tokens)
    _one_line(info)


def test_cache_room_and_batch(make_model):
    model = make_model(TINY)
    cache = model.new_cache(1, capacity=10)
    model(np.arange(8)[None], cache=cache)
    with pytest.raises(ValueError, match=r"11 positions \(start 8 \+ 3 new\) exceeds the cache capacity 10") as info:
        model(np.arange(3)[None], cache=cache)
    _one_line(info)
    assert cache.start == 8, "a refused call must not advance the cache"
    with pytest.raises(ValueError, match=r"cache was made for batch 1, got tokens with batch 2"):
        model(np.zeros((2, 1), dtype=np.int64), cache=cache)
    for capacity in (0, TINY.max_seq_len + 1):
        with pytest.raises(ValueError, match=rf"capacity must be in \[1, 24\], got {capacity}"):
            model.new_cache(1, capacity=capacity)
    with pytest.raises(ValueError, match=r"pad must be 2 non-negative ints"):
        model.new_cache(2, pad=np.array([1, -1]))
    with pytest.raises(ValueError, match=r"pad must be 2 non-negative ints"):
        model.new_cache(2, pad=np.array([1.0, 0.0]))


@pytest.mark.parametrize("kwargs,error,match", [
    (dict(dim=100, n_heads=3), ValueError, r"dim=100 is not divisible by n_heads=3"),
    (dict(n_heads=4, n_kv_heads=3), ValueError, r"n_heads=4 is not divisible by n_kv_heads=3"),
    (dict(dim=12, n_heads=4, n_kv_heads=2), ValueError, r"head size dim/n_heads=3 must be even"),
    (dict(n_layers=0), ValueError, r"n_layers must be >= 1, got 0"),
    (dict(vocab_size="1024"), TypeError, r"^ModelConfig.vocab_size must be an int >= 1, got '1024'$"),
    (dict(dim=128.0), TypeError, r"^ModelConfig.dim must be an int >= 1, got 128.0$"),
    (dict(norm_eps=float("nan")), ValueError, r"norm_eps must be a finite number > 0, got nan"),
    (dict(vocab_size=70000), ValueError, r"vocab_size=70000 exceeds 65536"),
])
def test_bad_config(kwargs, error, match):
    with pytest.raises(error, match=match) as info:
        ModelConfig(**kwargs)
    _one_line(info)


def test_a_config_takes_numpy_integers_as_the_ints_they_are():
    from glassllm.train import TrainConfig

    given = ModelConfig(**{k: np.int64(v) for k, v in TINY.to_dict().items() if isinstance(v, int)},
                        norm_eps=TINY.norm_eps, rope_theta=TINY.rope_theta)
    assert given == TINY and all(type(getattr(given, k)) is int for k in ("dim", "n_layers", "vocab_size"))
    assert ModelConfig.from_json(given.to_json()) == TINY                 # plain ints all the way to JSON
    run = TrainConfig(steps=np.int32(7), batch_size=np.uint8(2))
    assert (run.steps, run.batch_size) == (7, 2) and type(run.steps) is int and type(run.batch_size) is int
    with pytest.raises(TypeError, match=r"^ModelConfig.n_layers must be an int >= 1, got True$"):
        ModelConfig(n_layers=True)


def test_bad_config_dict_and_model_arguments(make_model):
    with pytest.raises(ValueError, match=r"unknown model config key\(s\) \['heads'\]"):
        ModelConfig.from_dict({"heads": 4})
    with pytest.raises(ValueError, match=r"not valid JSON"):
        ModelConfig.from_json("{")
    with pytest.raises(TypeError, match=r"config must be a ModelConfig, got dict"):
        Transformer({"dim": 32})
    model = make_model(TINY)
    state = model.state_dict()
    state["norm.weight"] = np.ones(7)
    with pytest.raises(ValueError, match=r"'norm.weight' has shape \(7,\), expected \(32,\)"):
        model.load_state_dict(state)
    with pytest.raises(ValueError, match=r"targets shape \(1, 3\) does not match logits shape \(1, 4\)"):
        model.loss(np.zeros((1, 4), dtype=np.int64), np.zeros((1, 3), dtype=np.int64))


def test_one_dimensional_tokens_are_one_row(make_model):
    model = make_model(TINY)
    with no_grad():
        np.testing.assert_array_equal(model(np.arange(5)).data, model(np.arange(5)[None]).data)


# ----------------------------------------------------------------------------
# The math modules need nothing but NumPy
# ----------------------------------------------------------------------------

def _top_level_modules(imports: str) -> set[str]:
    code = f"""
import importlib.util, json, sys
{imports}
print(json.dumps(sorted({{name.split(".")[0] for name in sys.modules}})))
"""
    run = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr
    return set(json.loads(run.stdout))


def test_core_imports_pull_in_only_numpy():
    # What a bare interpreter already holds (site hooks may load packages) is not ours.
    baseline = _top_level_modules("")
    loaded = _top_level_modules(
        "import glassllm.autograd, glassllm.nn, glassllm.config\n"
        "if importlib.util.find_spec('glassllm.tokenizer') is not None:\n"
        "    import glassllm.tokenizer")
    added = loaded - baseline - set(sys.stdlib_module_names) - {"glassllm", "numpy"}
    added = {name for name in added if not name.startswith("_")}  # C helpers of the stdlib
    assert not added, f"core modules imported {sorted(added)}"
    assert "numpy" in loaded


@pytest.mark.parametrize("dtype", [np.float16, "float16", "bfloat16", "bogus", np.int32, True])
def test_a_model_computes_in_float32_or_float64_only(dtype, tmp_path):
    """float16 used to be accepted, then broke inside the forward, and a model saved from it could
    not be loaded again: every way in now refuses it in one line."""
    from glassllm.checkpoint import load_model, save_model
    from glassllm.tokenizer import Tokenizer

    config = ModelConfig(vocab_size=257, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=16)
    words = "dtype must be float32 or float64, got"
    with pytest.raises(ValueError, match=words):
        Transformer(config, dtype=dtype)
    model = Transformer(config)
    with pytest.raises(ValueError, match=words):
        model.astype(dtype)
    assert model.dtype == np.float32
    path = tmp_path / "m.safetensors"
    save_model(path, model, Tokenizer.train(["ab"], vocab_size=257))
    with pytest.raises(ValueError, match=words):
        load_model(path, dtype=dtype)
    assert load_model(path, dtype="float64")[0].dtype == np.float64


def test_a_cache_that_does_not_fit_the_model_is_refused():
    """A cache of another dtype or shape used to be read silently (float64 keys in a float32 model
    turned its logits float64; int keys truncated them)."""
    from glassllm.nn import KVCache

    config = ModelConfig(vocab_size=257, dim=32, n_layers=2, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=16)
    model = Transformer(config)
    for cache in (KVCache(config, 1, dtype=np.float64),
                  KVCache(ModelConfig(**{**config.to_dict(), "n_layers": 3}), 1)):
        with pytest.raises(ValueError, match="make it with model.new_cache"):
            model(np.array([[1, 2]]), cache)
    for kwargs, error, words in ((dict(dtype=np.int32), ValueError, "dtype must be float32 or float64"),
                                 (dict(capacity=3.9), TypeError, "capacity must be an int, got 3.9"),
                                 (dict(batch=0), ValueError, "batch must be >= 1, got 0")):
        with pytest.raises(error, match=words):
            KVCache(config, **{"batch": 1, **kwargs})
    assert model(np.array([[1, 2]]), model.new_cache(1)).dtype == np.float32


def test_loss_of_one_unbatched_row():
    config = ModelConfig(vocab_size=257, dim=32, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=64, max_seq_len=16)
    model = Transformer(config, dtype=np.float64)
    assert float(model.loss([1, 2, 3], [2, 3, 4]).data) == float(model.loss([[1, 2, 3]], [[2, 3, 4]]).data)


def test_a_tracer_with_only_wants_and_record_still_sees_probs():
    """The smallest tracer (begin_forward, wants, record) is enough: ``probs``, computed only for a tracer that
    records it, reaches one that has no ``observes`` method, and equals the softmax of the logits."""
    model = Transformer(TINY, seed=3, dtype=np.float64)
    tracer = TeachingTracer()
    assert not hasattr(tracer, "observes")
    model.set_tracer(tracer)
    try:
        logits = model(np.array([[1, 2, 3]])).data
    finally:
        model.set_tracer(None)
    shifted = logits - logits.max(axis=-1, keepdims=True)
    expected = np.exp(shifted) / np.exp(shifted).sum(axis=-1, keepdims=True)
    np.testing.assert_allclose(tracer.values["probs"], expected, rtol=1e-12, atol=1e-15)
