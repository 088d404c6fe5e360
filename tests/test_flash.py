"""The tiled online-softmax attention equals dense attention, values and gradients."""

import numpy as np
import pytest

from glassllm import autograd as ag
from glassllm.kernels import attention, flash_attention
from glassllm.nn import causal_mask


def _inputs(rng, B, H, G, n, start, D, dtype):
    m = start + n
    make = lambda *shape: ag.Tensor(rng.normal(size=shape).astype(dtype), requires_grad=True)  # noqa: E731
    return make(B, H, n, D), make(B, G, m, D), make(B, G, m, D)


def _dense_mask(B, n, start, pad):
    return np.broadcast_to(causal_mask(n, start + n, start, pad), (B, n, start + n))


@pytest.mark.parametrize("dtype,tol", [(np.float64, 1e-12), (np.float32, 1e-5)])
@pytest.mark.parametrize(
    "B,H,G,n,start,pad,block",
    [
        (2, 4, 2, 37, 0, None, (16, 8)),      # ragged last blocks
        (2, 4, 2, 13, 20, None, (4, 8)),      # queries after a cache: start > 0
        (3, 6, 3, 29, 0, [0, 5, 40], (8, 8)),  # left padding; row 2 has no legal key at all
        (1, 4, 1, 64, 0, None, (64, 64)),     # one tile
        (1, 2, 2, 50, 3, [2], (7, 5)),        # H = G (no sharing), odd blocks
    ],
)
def test_flash_equals_dense(B, H, G, n, start, pad, block, dtype, tol):
    rng = np.random.default_rng(n + start)
    pad = None if pad is None else np.array(pad)
    q, k, v = _inputs(rng, B, H, G, n, start, 8, dtype)
    g = rng.normal(size=(B, H, n, 8)).astype(dtype)

    dense = attention(q, k, v, _dense_mask(B, n, start, pad)[:, None], 0.3)
    dense.backward(g)
    want = [dense.data] + [t.grad for t in (q, k, v)]
    for t in (q, k, v):
        t.grad = None

    tiled = flash_attention(q, k, v, 0.3, start, pad, *block)
    tiled.backward(g)
    got = [tiled.data] + [t.grad for t in (q, k, v)]

    for name, a, b in zip(("out", "dq", "dk", "dv"), got, want):
        assert a.dtype == dtype, name
        assert np.all(np.isfinite(a)), name
        scale = max(1.0, float(np.abs(b).max()))
        assert np.abs(a - b).max() <= tol * scale, name


def test_fully_masked_rows_are_zero_not_nan():
    rng = np.random.default_rng(0)
    q, k, v = _inputs(rng, 1, 2, 1, 6, 0, 4, np.float64)
    out = flash_attention(q, k, v, 0.5, 0, np.array([100]), 4, 4)
    assert np.array_equal(out.data, np.zeros_like(out.data))
    out.backward(np.ones_like(out.data))
    assert all(np.all(np.isfinite(t.grad)) for t in (q, k, v))


def test_causal_tiles_skip_the_future():
    """Perturbing a future key or value never changes an earlier query's output."""
    rng = np.random.default_rng(1)
    q, k, v = _inputs(rng, 1, 2, 1, 40, 0, 4, np.float64)
    before = flash_attention(q, k, v, 0.5, 0, None, 8, 8).data
    k.data[:, :, 30:] += 100.0
    v.data[:, :, 30:] -= 100.0
    after = flash_attention(q, k, v, 0.5, 0, None, 8, 8).data
    assert np.array_equal(before[:, :, :30], after[:, :, :30])
    assert not np.allclose(before[:, :, 30:], after[:, :, 30:])
