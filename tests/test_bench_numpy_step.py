"""The benchmarks' hand-written NumPy step computes the same training step as glassllm.

``bench/numpy_step.py`` is the no-autograd step that ``bench/bench_train.py``
times beside glassllm and PyTorch. Its speed means something only if it does
the same work, so here its loss, gradient norm, every gradient and the
weights after three AdamW steps are compared with glassllm's
:func:`~glassllm.train.train_step` on the same weights and batches, in float64,
for both of its attention variants and with clipping active.
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.support.glassllm_testing import randomize
from glassllm.config import ModelConfig
from glassllm.nn import Transformer
from glassllm.optim import AdamW
from glassllm.train import train_step
from bench.numpy_step import NumpyStep           # the repository root is on pytest's pythonpath (pyproject.toml)


@pytest.mark.parametrize("attention", ["dense", "tiled"])
@pytest.mark.parametrize("T", [17, 130])  # 130 >= kernels.FLASH_MIN_QUERIES: glassllm's own tiled path
def test_hand_written_step_equals_glassllm_step(attention, T):
    config = ModelConfig(n_layers=2, max_seq_len=160)
    rng = np.random.default_rng(7)
    model = randomize(Transformer(config, seed=0, dtype=np.float64), rng)
    hand = NumpyStep(model.state_dict(), config, lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1,
                     grad_clip=1.0, dtype=np.float64, attention=attention)
    opt = AdamW(model.named_parameters(), lr=3e-3, betas=(0.9, 0.95), eps=1e-8, weight_decay=0.1)
    for step in range(3):
        x, y = rng.integers(0, config.vocab_size, (2, T)), rng.integers(0, config.vocab_size, (2, T))
        if step == 0:  # the gradients themselves, before any clipping or update
            hand.loss_and_grads(x, y)
            model.zero_grad()
            model.loss(x, y).backward()
            named = dict(model.named_parameters())
            theirs = {name: named[name].grad for name in named}
            mine = hand.state_dict(hand.g)
            assert mine.keys() == theirs.keys()
            for name in theirs:
                np.testing.assert_allclose(mine[name], theirs[name], rtol=1e-10, atol=1e-12, err_msg=name)
        want_loss, want_norm = train_step(model, opt, [(x, y)], 3e-3, 1.0)
        got_loss, got_norm = hand.step(x, y, 3e-3)
        assert want_norm > 1.0, "the test should exercise clipping"
        assert got_loss == pytest.approx(want_loss, rel=1e-12)
        assert got_norm == pytest.approx(want_norm, rel=1e-10)
    got = hand.state_dict()
    for name, want in model.state_dict().items():
        np.testing.assert_allclose(got[name], want, rtol=1e-10, atol=1e-12, err_msg=name)


def test_hand_written_step_refuses_an_unknown_attention():
    with pytest.raises(ValueError, match="'sparse'"):
        NumpyStep(Transformer(ModelConfig(n_layers=1)).state_dict(), ModelConfig(n_layers=1), attention="sparse")


@pytest.mark.parametrize("attention", ["dense", "tiled"])
def test_hand_written_step_equals_glassllm_step_in_float32(attention):
    """The benchmark runs float32 (RoPE through complex64 views): the same gradients to float32 rounding."""
    config = ModelConfig(n_layers=2, max_seq_len=160)
    rng = np.random.default_rng(8)
    model = randomize(Transformer(config, seed=0, dtype=np.float32), rng)
    hand = NumpyStep(model.state_dict(), config, dtype=np.float32, attention=attention)
    x, y = rng.integers(0, config.vocab_size, (2, 130)), rng.integers(0, config.vocab_size, (2, 130))
    loss = hand.loss_and_grads(x, y)
    model.zero_grad()
    want = model.loss(x, y)
    want.backward()
    assert loss == pytest.approx(float(want.data), rel=1e-5)
    mine, named = hand.state_dict(hand.g), dict(model.named_parameters())
    for name, p in named.items():
        assert mine[name].dtype == np.float32
        scale = float(np.abs(p.grad).max())
        np.testing.assert_allclose(mine[name], p.grad, rtol=0, atol=1e-4 * scale, err_msg=name)
