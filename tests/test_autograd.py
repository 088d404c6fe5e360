"""Every autograd primitive against two independent references.

1. Central finite differences in float64 (``gradcheck``): the backward's
   vector-Jacobian product with a random cotangent must match the numerical one.
2. PyTorch float64 values and gradients on the same inputs (``compare_with_torch``,
   one helper for every op, in the style of tinygrad's ``test_ops.py``).

Both run over one table of cases, ``CASES``, which covers broadcasting on
either side, python scalars on either side, repeated indices, and rows where
every key is masked. Further down: the fused ops equal to their spelled-out
forms, softmax edge cases that must not produce NaN, deep graphs, ``no_grad``
and dtype preservation.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest

from glassllm import autograd as ag
from glassllm import kernels
from glassllm.autograd import Tensor, no_grad, softmax_np

NEG_INF = -np.inf


# ----------------------------------------------------------------------------
# The case table
# ----------------------------------------------------------------------------

@dataclass
class Case:
    """One op on fixed inputs.

    ``glass(*tensors)`` and ``torch_fn(torch, *tensors)`` compute the same thing;
    ``inputs(rng)`` makes the float64 arrays that are differentiated.
    """
    name: str
    glass: Callable
    torch_fn: Callable
    inputs: Callable


def _n(*shape, lo=None):
    """Inputs: standard normal arrays of the given shapes (or uniform in [lo, lo+1] when lo is set)."""
    def make(rng):
        return [rng.standard_normal(s) if lo is None else lo + rng.random(s) for s in shape]
    return make


# Fixed non-differentiable arguments shared by glassllm and torch.
IDS = np.array([[3, 0, 3], [1, 4, 1]])                          # repeated ids accumulate
TARGETS = np.array([[2, -100, 0, 4], [4, 4, -100, 1]])          # -100 = ignored
ROWS = np.array([2, 0, 2, 1])                                   # advanced index with a repeat
MASK_BCAST = np.array([[True, False, False, True]])             # (1, 4) -> broadcast over rows
COND = np.array([[True], [False], [True]])                      # (3, 1) -> broadcast over columns
# Attention mask (n=3 queries, m=5 keys), True = forbidden; query 1 sees nothing.
ATT_MASK = np.array([[False, False, True, True, True],
                     [True, True, True, True, True],
                     [False, False, False, False, True]])
ATT_MASK_B = np.stack([ATT_MASK, ~np.eye(3, 5, k=2, dtype=bool)])[:, None]  # (B=2, 1, n, m)
DEAD_ROWS = np.array([[False, True, False, True],
                      [True, True, True, True],                 # fully masked row
                      [False, False, False, False]])


def _rope_tables(positions, half):
    angles = np.asarray(positions, dtype=np.float64)[..., None] * (10.0 ** (-np.arange(half) / half))
    return np.cos(angles), np.sin(angles)


COS, SIN = _rope_tables(np.arange(2, 5), 3)                     # (n=3, D/2=3)
COS_B, SIN_B = _rope_tables(np.array([[0, 1, 2], [5, 6, 7]])[:, None], 3)  # (B, 1, n, D/2)


def _t_rope(torch, x, cos, sin):
    # Independent form: each pair as a complex number times exp(i angle).
    c = torch.complex(torch.as_tensor(cos), torch.as_tensor(sin))
    z = torch.view_as_complex(x.reshape(*x.shape[:-1], -1, 2).contiguous())
    return torch.view_as_real(z * c).reshape(x.shape)


def _t_safe_softmax(torch, s, dim=-1):
    dead = torch.isneginf(s).all(dim=dim, keepdim=True)
    return torch.softmax(s.masked_fill(dead, 0.0), dim=dim).masked_fill(dead, 0.0)


def _t_attention(torch, q, k, v, mask, scale):
    r = q.shape[1] // k.shape[1]
    k, v = torch.repeat_interleave(k, r, dim=1), torch.repeat_interleave(v, r, dim=1)
    s = q @ k.transpose(-1, -2) * scale
    if mask is not None:
        s = s.masked_fill(torch.as_tensor(mask), float("-inf"))
    return _t_safe_softmax(torch, s) @ v


def _t(torch, a):
    return torch.as_tensor(a)


def _F(torch):
    return torch.nn.functional


CASES = [
    # -- elementwise arithmetic, with broadcasting on either side and python scalars
    Case("add", lambda a, b: a + b, lambda T, a, b: a + b, _n((3, 4), (3, 4))),
    Case("add_bcast", lambda a, b: a + b, lambda T, a, b: a + b, _n((2, 1, 3), (4, 1))),
    Case("add_scalar", lambda a: 1.5 + a + 2, lambda T, a: 1.5 + a + 2, _n((3, 2))),
    Case("sub_bcast", lambda a, b: a - b, lambda T, a, b: a - b, _n((4,), (3, 4))),
    Case("rsub_scalar", lambda a: 2.0 - a, lambda T, a: 2.0 - a, _n((3,))),
    Case("mul_bcast", lambda a, b: a * b, lambda T, a, b: a * b, _n((3, 1), (1, 5))),
    Case("mul_scalar", lambda a: a * 3 * 0.5, lambda T, a: a * 3 * 0.5, _n((2, 3))),
    Case("div_bcast", lambda a, b: a / b, lambda T, a, b: a / b, _n((2, 3, 4), (3, 1), lo=0.5)),
    Case("rdiv_scalar", lambda a: 1.0 / a, lambda T, a: 1.0 / a, _n((5,), lo=0.5)),
    Case("neg", lambda a: -a, lambda T, a: -a, _n((2, 3))),
    Case("pow2", lambda a: a ** 2, lambda T, a: a ** 2, _n((3, 3))),
    Case("pow3", lambda a: ag.pow(a, 3), lambda T, a: a ** 3, _n((4,))),
    Case("pow_frac", lambda a: a ** -1.5, lambda T, a: a ** -1.5, _n((2, 3), lo=0.5)),
    Case("rpow_base2", lambda a: 2 ** a, lambda T, a: 2 ** a, _n((2, 3))),
    Case("rpow_base_half", lambda a: ag.rpow(0.5, a) * a, lambda T, a: 0.5 ** a * a, _n((4,))),
    Case("exp", ag.exp, lambda T, a: a.exp(), _n((2, 4))),
    Case("log", ag.log, lambda T, a: a.log(), _n((2, 4), lo=0.3)),
    Case("sqrt", ag.sqrt, lambda T, a: a.sqrt(), _n((2, 4), lo=0.3)),
    Case("rsqrt", ag.rsqrt, lambda T, a: a.rsqrt(), _n((2, 4), lo=0.3)),
    Case("sigmoid", ag.sigmoid, lambda T, a: T.sigmoid(a), lambda rng: [rng.standard_normal((2, 4)) * 6]),
    Case("silu", ag.silu, lambda T, a: _F(T).silu(a), lambda rng: [rng.standard_normal((2, 4)) * 4]),
    # -- linear algebra and reductions
    Case("matmul", lambda a, b: a @ b, lambda T, a, b: a @ b, _n((3, 4), (4, 5))),
    Case("matmul_batched_bcast", lambda a, b: a @ b, lambda T, a, b: a @ b, _n((2, 1, 3, 4), (3, 4, 2))),
    Case("matmul_rhs_batched", lambda a, b: a @ b, lambda T, a, b: a @ b, _n((3, 4), (2, 4, 3))),
    Case("sum_all", lambda a: a.sum(), lambda T, a: a.sum(), _n((2, 3, 4))),
    Case("sum_axis", lambda a: ag.sum(a, axis=1), lambda T, a: a.sum(1), _n((2, 3, 4))),
    Case("sum_axes_keepdims", lambda a: ag.sum(a, axis=(0, -1), keepdims=True),
         lambda T, a: a.sum((0, -1), keepdim=True), _n((2, 3, 4))),
    Case("mean_all", lambda a: a.mean(), lambda T, a: a.mean(), _n((3, 4))),
    Case("mean_axis_keepdims", lambda a: ag.mean(a, axis=-1, keepdims=True),
         lambda T, a: a.mean(-1, keepdim=True), _n((2, 3, 4))),
    # -- softmax family
    Case("softmax", lambda a: ag.softmax(a, axis=-1), lambda T, a: T.softmax(a, -1), _n((3, 5))),
    Case("softmax_axis0", lambda a: ag.softmax(a, axis=0), lambda T, a: T.softmax(a, 0), _n((3, 5))),
    Case("softmax_dead_row", lambda a: ag.softmax(ag.masked_fill(a, DEAD_ROWS, NEG_INF)),
         lambda T, a: _t_safe_softmax(T, a.masked_fill(_t(T, DEAD_ROWS), float("-inf"))), _n((3, 4))),
    Case("softmax_masked_bcast_axis0", lambda a: ag.softmax(ag.masked_fill(a, MASK_BCAST, NEG_INF), axis=0),
         lambda T, a: _t_safe_softmax(T, a.masked_fill(_t(T, MASK_BCAST), float("-inf")), dim=0), _n((3, 4))),
    Case("log_softmax", lambda a: ag.log_softmax(a, axis=-1), lambda T, a: T.log_softmax(a, -1), _n((3, 5))),
    Case("cross_entropy_ignore", lambda a: ag.cross_entropy(a, TARGETS),
         lambda T, a: _F(T).cross_entropy(a.reshape(-1, 5), _t(T, TARGETS).reshape(-1)), _n((2, 4, 5))),
    # -- shape ops
    Case("reshape", lambda a: a.reshape(3, 8) * a.reshape(3, 8), lambda T, a: a.reshape(3, 8) ** 2,
         _n((2, 3, 4))),
    Case("transpose_axes", lambda a: a.transpose(2, 0, 1), lambda T, a: a.permute(2, 0, 1), _n((2, 3, 4))),
    Case("transpose_T", lambda a: a.T, lambda T, a: a.permute(2, 1, 0), _n((2, 3, 4))),
    Case("getitem_slice", lambda a: a[1:, ::-2], lambda T, a: a[1:].flip(1)[:, ::2], _n((3, 5))),
    Case("getitem_int_newaxis", lambda a: a[1, :, None] * a[-1, ::2][..., None],
         lambda T, a: a[1, :, None] * a[-1, ::2][..., None], _n((3, 2))),
    Case("getitem_repeat", lambda a: a[ROWS], lambda T, a: a[_t(T, ROWS)], _n((3, 4))),
    Case("getitem_pairs", lambda a: a[ROWS, np.array([0, 3, 0, 1])],
         lambda T, a: a[_t(T, ROWS), _t(T, np.array([0, 3, 0, 1]))], _n((3, 4))),
    Case("embedding", lambda w: ag.embedding(w, IDS), lambda T, w: _F(T).embedding(_t(T, IDS), w), _n((5, 3))),
    Case("concatenate", lambda a, b: ag.concatenate([a, b, a], axis=1),
         lambda T, a, b: T.cat([a, b, a], 1), _n((2, 3), (2, 1))),
    Case("split_sizes", lambda a: ag.concatenate(ag.split(a, [1, 3], axis=1)[::-1], axis=1),
         lambda T, a: T.cat(T.split(a, [1, 3], 1)[::-1], 1), _n((2, 4))),
    Case("split_equal", lambda a: ag.split(a, 2, axis=0)[1] * 2.0, lambda T, a: a.chunk(2, 0)[1] * 2, _n((4, 3))),
    Case("repeat_interleave", lambda a: ag.repeat_interleave(a, 3, axis=1),
         lambda T, a: T.repeat_interleave(a, 3, dim=1), _n((2, 2, 3))),
    Case("repeat_interleave_neg_axis", lambda a: ag.repeat_interleave(a, 2, axis=-1),
         lambda T, a: T.repeat_interleave(a, 2, dim=-1), _n((3, 2))),
    Case("masked_fill_bcast", lambda a: ag.masked_fill(a, MASK_BCAST, -3.0),
         lambda T, a: a.masked_fill(_t(T, MASK_BCAST), -3.0), _n((3, 4))),
    Case("where_bcast", lambda a, b: ag.where(COND, a, b), lambda T, a, b: T.where(_t(T, COND), a, b),
         _n((3, 4), (4,))),
    # -- the kernels' fused ops (glassllm.kernels), against PyTorch
    Case("linear", ag.linear, lambda T, x, w: _F(T).linear(x, w), _n((2, 3, 4), (5, 4))),
    Case("rms_norm", lambda x, w: kernels.rms_norm(x, w, 1e-5),
         lambda T, x, w: _F(T).rms_norm(x, (4,), w, 1e-5), _n((2, 3, 4), (4,))),
    Case("rope", lambda x: ag.rope(x, COS, SIN), lambda T, x: _t_rope(T, x, COS, SIN), _n((2, 2, 3, 6))),
    Case("rope_batched_positions", lambda x: ag.rope(x, COS_B, SIN_B),
         lambda T, x: _t_rope(T, x, COS_B, SIN_B), _n((2, 2, 3, 6))),
    Case("attention_gqa_dead_row", lambda q, k, v: kernels.attention(q, k, v, ATT_MASK, 0.5),
         lambda T, q, k, v: _t_attention(T, q, k, v, ATT_MASK, 0.5), _n((1, 4, 3, 2), (1, 2, 5, 2), (1, 2, 5, 2))),
    Case("attention_batch_mask", lambda q, k, v: kernels.attention(q, k, v, ATT_MASK_B, 0.7),
         lambda T, q, k, v: _t_attention(T, q, k, v, ATT_MASK_B, 0.7),
         _n((2, 3, 3, 2), (2, 1, 5, 2), (2, 1, 5, 2))),
    Case("attention_nomask", lambda q, k, v: kernels.attention(q, k, v, None, 0.3),
         lambda T, q, k, v: _t_attention(T, q, k, v, None, 0.3), _n((1, 2, 3, 4), (1, 2, 4, 4), (1, 2, 4, 4))),
    Case("swiglu", kernels.swiglu, lambda T, a: _F(T).silu(a[..., :3]) * a[..., 3:],
         lambda rng: [rng.standard_normal((2, 3, 6)) * 3]),
    Case("linear_stacked", lambda x, a, b: ag.linear(x, (a, b)),
         lambda T, x, a, b: _F(T).linear(x, T.cat([a, b])), _n((2, 3, 4), (5, 4), (2, 4))),
]

# Every primitive the module exports must appear in the table (softmax_np is
# NumPy-only and tested below; tensor is the constructor).
_COVERED_BY = {"add", "sub", "mul", "div", "neg", "pow", "rpow", "matmul", "sum", "mean", "exp", "log", "sqrt",
               "rsqrt", "sigmoid", "silu", "softmax", "log_softmax", "cross_entropy", "reshape", "transpose",
               "getitem", "embedding", "concatenate", "split", "repeat_interleave", "masked_fill", "where",
               "linear", "rope"}
# Plain NumPy helpers and the helpers for defining ops (each exercised by the ops that use them).
_HELPERS = {"Tensor", "no_grad", "is_grad_enabled", "tensor", "as_tensor", "make_op", "softmax_np",
            "log_softmax_np", "logsumexp_np", "sigmoid_np", "rope_table", "rotate"}


def test_table_covers_every_primitive():
    primitives = set(ag.__all__) - _HELPERS
    assert primitives == _COVERED_BY, "a new primitive needs a case in CASES"
    for op in primitives:
        assert any(op in c.name for c in CASES), f"no case exercises {op}"


# ----------------------------------------------------------------------------
# Reference 1: finite differences
# ----------------------------------------------------------------------------

def gradcheck(fn, arrays, rng, eps=1e-6, rtol=1e-6, atol=1e-8):
    """Compare ``fn``'s backward with central differences of <w, fn(x)> for a random cotangent w."""
    xs = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    out = fn(*xs)
    w = rng.standard_normal(out.shape)
    out.backward(w)

    def objective(values):
        with no_grad():
            return float(np.sum(w * fn(*[Tensor(v) for v in values]).data))

    for i, a in enumerate(arrays):
        numeric = np.zeros_like(a)
        for idx in np.ndindex(a.shape):
            plus = [v.copy() for v in arrays]
            minus = [v.copy() for v in arrays]
            plus[i][idx] += eps
            minus[i][idx] -= eps
            numeric[idx] = (objective(plus) - objective(minus)) / (2 * eps)
        assert xs[i].grad is not None, f"input {i} received no gradient"
        assert xs[i].grad.shape == a.shape
        np.testing.assert_allclose(xs[i].grad, numeric, rtol=rtol, atol=atol, err_msg=f"input {i}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_finite_differences(case, rng):
    gradcheck(case.glass, case.inputs(rng), rng)


# ----------------------------------------------------------------------------
# Reference 2: PyTorch float64
# ----------------------------------------------------------------------------

def compare_with_torch(glass_fn, torch_fn, arrays, rng, rtol=1e-12, atol=1e-12):
    """Run one op on the same float64 inputs in glassllm and PyTorch; compare outputs and input gradients."""
    torch = pytest.importorskip("torch")
    xs = [Tensor(a.copy(), requires_grad=True) for a in arrays]
    ts = [torch.tensor(a, dtype=torch.float64, requires_grad=True) for a in arrays]
    out, ref = glass_fn(*xs), torch_fn(torch, *ts)
    assert out.dtype == np.float64
    assert out.shape == tuple(ref.shape)
    np.testing.assert_allclose(out.data, ref.detach().numpy(), rtol=rtol, atol=atol)
    w = rng.standard_normal(out.shape)
    out.backward(w)
    ref.backward(torch.as_tensor(w))
    for i, (x, t) in enumerate(zip(xs, ts)):
        np.testing.assert_allclose(x.grad, t.grad.numpy(), rtol=rtol, atol=atol, err_msg=f"grad of input {i}")


@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_matches_torch(case, rng):
    compare_with_torch(case.glass, case.torch_fn, case.inputs(rng), rng)


# ----------------------------------------------------------------------------
# float32 in, float32 out -- python scalars must not upcast
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("case", CASES, ids=lambda c: c.name)
def test_float32_stays_float32(case, rng):
    arrays = [a.astype(np.float32) for a in case.inputs(rng)]
    xs = [Tensor(a, requires_grad=True) for a in arrays]
    out = case.glass(*xs)
    assert out.dtype == np.float32, f"{case.name} returned {out.dtype}"
    out.backward(np.ones(out.shape, dtype=np.float32))
    for x in xs:
        assert x.grad.dtype == np.float32, f"{case.name} gave a {x.grad.dtype} gradient"


def test_python_numbers_become_float32():
    assert Tensor(2.0).dtype == np.float32
    assert Tensor([1.0, 2.0], requires_grad=True).dtype == np.float32
    assert Tensor(np.zeros(2)).dtype == np.float64  # ndarrays keep their dtype
    x = Tensor(np.ones(3, dtype=np.float32), requires_grad=True)
    for y in (x + np.float64(1.0), x * np.float64(2.0), x / 3, 1 - x, x ** 0.5):
        assert y.dtype == np.float32


# ----------------------------------------------------------------------------
# Fused ops equal the same computation spelled out with small primitives
# ----------------------------------------------------------------------------

def _spelled_rope(x, cos, sin):
    D = x.shape[-1]
    pairs = x.reshape(*x.shape[:-1], D // 2, 2)                          # (..., n, D/2, 2)
    x0, x1 = pairs[..., 0], pairs[..., 1]                                # (..., n, D/2)
    y0 = x0 * cos - x1 * sin
    y1 = x0 * sin + x1 * cos
    stacked = ag.concatenate([y0.reshape(*y0.shape, 1), y1.reshape(*y1.shape, 1)], axis=-1)
    return stacked.reshape(*x.shape)                                     # (..., n, D)


def _spelled_attention(q, k, v, mask, scale):
    r = q.shape[1] // k.shape[1]
    k, v = ag.repeat_interleave(k, r, axis=1), ag.repeat_interleave(v, r, axis=1)  # (B, H, m, D)
    scores = (q @ k.transpose(0, 1, 3, 2)) * scale                       # (B, H, n, m)
    if mask is not None:
        scores = ag.masked_fill(scores, mask, NEG_INF)
    return ag.softmax(scores, axis=-1) @ v                               # (B, H, n, D)


def _spelled_cross_entropy(logits, targets, ignore_index):
    V = logits.shape[-1]
    flat = logits.reshape(-1, V)                                         # (N, V)
    t = targets.reshape(-1)
    keep = t != ignore_index
    logp = ag.log_softmax(flat, axis=-1)[np.arange(len(t)), np.where(keep, t, 0)]  # (N,)
    return -(logp * keep.astype(logits.dtype)).sum() / max(int(keep.sum()), 1)


FUSED = [
    ("linear", lambda x, w: ag.linear(x, w), lambda x, w: x @ w.T, _n((2, 3, 4), (5, 4))),
    ("rms_norm", lambda x, w: kernels.rms_norm(x, w, 1e-6),
     lambda x, w: x * ag.rsqrt(ag.mean(x * x, axis=-1, keepdims=True) + 1e-6) * w, _n((2, 3, 8), (8,))),
    ("rope", lambda x: ag.rope(x, COS_B, SIN_B), lambda x: _spelled_rope(x, COS_B, SIN_B), _n((2, 4, 3, 6))),
    ("attention", lambda q, k, v: kernels.attention(q, k, v, ATT_MASK_B, 0.4),
     lambda q, k, v: _spelled_attention(q, k, v, ATT_MASK_B, 0.4), _n((2, 4, 3, 3), (2, 2, 5, 3), (2, 2, 5, 3))),
    ("cross_entropy_ignore_index", lambda z: ag.cross_entropy(z, TARGETS, ignore_index=-100),
     lambda z: _spelled_cross_entropy(z, TARGETS, -100), _n((2, 4, 5))),
    ("cross_entropy_other_ignore", lambda z: ag.cross_entropy(z, np.where(TARGETS < 0, 4, TARGETS), ignore_index=4),
     lambda z: _spelled_cross_entropy(z, np.where(TARGETS < 0, 4, TARGETS), 4), _n((2, 4, 5))),
]


@pytest.mark.parametrize("name,fused,spelled,inputs", FUSED, ids=[f[0] for f in FUSED])
def test_fused_equals_spelled_out(name, fused, spelled, inputs, rng):
    arrays = inputs(rng)
    a = [Tensor(x.copy(), requires_grad=True) for x in arrays]
    b = [Tensor(x.copy(), requires_grad=True) for x in arrays]
    out_a, out_b = fused(*a), spelled(*b)
    np.testing.assert_allclose(out_a.data, out_b.data, rtol=1e-12, atol=1e-13)
    w = rng.standard_normal(out_a.shape)
    out_a.backward(w)
    out_b.backward(w)
    for x, y in zip(a, b):
        np.testing.assert_allclose(x.grad, y.grad, rtol=1e-12, atol=1e-13)


def test_cross_entropy_all_ignored_is_zero_not_nan():
    z = Tensor(np.ones((2, 3)), requires_grad=True)
    loss = ag.cross_entropy(z, np.array([-100, -100]))
    loss.backward()
    assert loss.item() == 0.0
    assert np.all(z.grad == 0.0)


def test_cross_entropy_hand_value():
    # Two equal logits: -log(1/2); a logit gap of log 3: -log(3/4).
    z = Tensor(np.log(np.array([[1.0, 1.0], [3.0, 1.0]])), requires_grad=True)
    loss = ag.cross_entropy(z, np.array([0, 0]))
    assert loss.item() == pytest.approx((np.log(2) + np.log(4 / 3)) / 2, rel=1e-12)
    loss.backward()
    # d loss / d z = (softmax - onehot) / count
    np.testing.assert_allclose(z.grad, np.array([[-0.25, 0.25], [-0.125, 0.125]]), rtol=1e-12)


# ----------------------------------------------------------------------------
# No NaN: fully masked rows, huge scores, all-equal rows
# ----------------------------------------------------------------------------

def test_softmax_np_edge_rows():
    x = np.array([[NEG_INF, NEG_INF, NEG_INF],    # every key forbidden -> zeros
                  [1e4, -1e4, 0.0],               # huge scores -> one-hot, no overflow
                  [7.0, 7.0, 7.0],                # all equal -> uniform
                  [-1e4, -1e4, NEG_INF]])         # huge negative, one masked -> 1/2, 1/2, 0
    expected = np.array([[0, 0, 0], [1, 0, 0], [1 / 3, 1 / 3, 1 / 3], [0.5, 0.5, 0]])
    for dtype in (np.float64, np.float32):
        out = softmax_np(x.astype(dtype))
        assert out.dtype == dtype
        assert np.all(np.isfinite(out))
        np.testing.assert_allclose(out, expected, atol=1e-7)


def test_log_softmax_np_and_logsumexp_np_equal_torch_and_keep_dead_rows():
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(4)
    x = rng.standard_normal((3, 5, 7)) * 30 + 500                 # large entries: exp() alone would overflow
    for axis in (-1, 0, 1):
        t = torch.from_numpy(x)
        np.testing.assert_allclose(ag.log_softmax_np(x, axis), torch.log_softmax(t, dim=axis).numpy(), rtol=0, atol=1e-12)
        np.testing.assert_allclose(ag.logsumexp_np(x, axis), torch.logsumexp(t, dim=axis).numpy(), rtol=1e-14)
    dead = np.array([[-np.inf, -np.inf], [0.0, -np.inf]])
    assert ag.logsumexp_np(dead).tolist() == [-np.inf, 0.0]
    assert ag.log_softmax_np(dead).tolist() == [[-np.inf, -np.inf], [0.0, -np.inf]]
    np.testing.assert_array_equal(ag.log_softmax(Tensor(x)).data, ag.log_softmax_np(x))   # the primitive's forward


def test_softmax_np_integer_input_and_axis():
    np.testing.assert_allclose(softmax_np(np.array([[0, 0], [0, 0]]), axis=0), np.full((2, 2), 0.5))


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_autograd_softmax_edge_rows_have_finite_gradients(dtype):
    x = Tensor(np.array([[NEG_INF, NEG_INF], [1e4, -1e4], [3.0, 3.0]], dtype=dtype), requires_grad=True)
    y = ag.softmax(x)
    y.backward(np.array([[1.0, 2.0], [1.0, 2.0], [1.0, -1.0]], dtype=dtype))
    np.testing.assert_allclose(y.data, [[0, 0], [1, 0], [0.5, 0.5]])
    assert np.all(np.isfinite(x.grad))
    # all-equal row: d/dx_i = p_i (g_i - <g, p>) = 0.5 * (+-1 - 0)
    np.testing.assert_allclose(x.grad, [[0, 0], [0, 0], [0.5, -0.5]])


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_attention_edge_rows(dtype):
    """A fully masked query row mixes nothing (zeros); +-1e4 scores pick one key; equal scores average."""
    q = np.array([[[[1.0], [100.0], [0.0]]]], dtype=dtype)                # (1, 1, 3, 1)
    k = np.array([[[[100.0], [-100.0]]]], dtype=dtype)                    # (1, 1, 2, 1): scores +-1e4
    v = np.array([[[[2.0], [6.0]]]], dtype=dtype)
    mask = np.array([[True, True], [False, False], [False, False]])
    qt, kt, vt = (Tensor(a, requires_grad=True) for a in (q, k, v))
    out = kernels.attention(qt, kt, vt, mask, 1.0)
    out.backward(np.ones(out.shape, dtype=dtype))
    np.testing.assert_allclose(out.data[0, 0, :, 0], [0.0, 2.0, 4.0])   # dead, one-hot, uniform
    for t in (qt, kt, vt):
        assert np.all(np.isfinite(t.grad))
    np.testing.assert_allclose(vt.grad[0, 0, :, 0], [1.5, 0.5])          # column sums of the weights


def test_log_softmax_and_cross_entropy_huge_logits():
    z = Tensor(np.array([[1e4, -1e4, 0.0], [-1e4, -1e4, -1e4]]), requires_grad=True)
    loss = ag.cross_entropy(z, np.array([1, 2]))
    loss.backward()
    assert loss.item() == pytest.approx((2e4 + np.log(3)) / 2)
    assert np.all(np.isfinite(z.grad))
    assert np.all(np.isfinite(ag.log_softmax(z).data))


def test_sigmoid_and_silu_saturate_without_overflow():
    x = Tensor(np.array([-1000.0, -40.0, 0.0, 40.0, 1000.0]), requires_grad=True)
    with np.errstate(over="raise"):
        y = ag.silu(x) + ag.sigmoid(x)
        y.backward(np.ones(5))
    assert np.all(np.isfinite(y.data)) and np.all(np.isfinite(x.grad))
    np.testing.assert_allclose(ag.sigmoid(x).data, [0, 1 / (1 + np.exp(40)), 0.5, 1 / (1 + np.exp(-40)), 1])


# ----------------------------------------------------------------------------
# Graph mechanics
# ----------------------------------------------------------------------------

def test_deep_graph_does_not_recurse():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    y = x
    for _ in range(20_000):
        y = y + 1.0
    limit = sys.getrecursionlimit()
    y.sum().backward()
    assert sys.getrecursionlimit() == limit
    np.testing.assert_array_equal(x.grad, [1.0, 1.0])
    np.testing.assert_array_equal(y.data, [20_001.0, 20_002.0])


def test_shared_subexpression_gets_all_its_gradient():
    """A node reached along two paths (like a residual stream) passes its gradient on only once complete."""
    x = Tensor(np.array([1.0, -2.0]), requires_grad=True)
    a = x * 2.0
    b = a * 3.0
    c = ag.exp(b) + a               # a feeds c directly and through b
    c.sum().backward()
    # dc/dx = (6 exp(6x) + 1) * 2 / 2 ... by hand: d/dx [exp(6x) + 2x] = 6 exp(6x) + 2
    np.testing.assert_allclose(x.grad, 6 * np.exp(6 * x.data) + 2, rtol=1e-6)


def test_gradients_accumulate_across_backward_calls():
    x = Tensor(np.array([3.0]), requires_grad=True)
    (x * x).backward(np.array([1.0]))
    (x * 5.0).backward(np.array([1.0]))
    np.testing.assert_allclose(x.grad, [11.0])


def test_leaf_gradients_are_private_and_writable():
    """An op may give several inputs the same array; each leaf must own its gradient."""
    a = Tensor(np.ones(3), requires_grad=True)
    b = Tensor(np.ones(3), requires_grad=True)
    c = Tensor(np.ones((2, 3)), requires_grad=True)
    ((a + b).sum() + c.sum()).backward()
    assert a.grad is not b.grad
    for t in (a, b, c):
        assert t.grad.flags.writeable
    a.grad *= 0.5                      # what an optimizer's clipping does
    np.testing.assert_array_equal(b.grad, np.ones(3))
    np.testing.assert_array_equal(c.grad, np.ones((2, 3)))


def test_no_grad_records_nothing():
    x = Tensor(np.ones(3), requires_grad=True)
    assert ag.is_grad_enabled()
    with no_grad():
        assert not ag.is_grad_enabled()
        y = ag.softmax(ag.linear(x.reshape(1, 3), Tensor(np.eye(3), requires_grad=True)) * 2.0)
        with no_grad():
            z = y + x
        w = z * x
    for t in (y, z, w):
        assert not t.requires_grad
        assert t._parents == () and t._backward is None
    assert ag.is_grad_enabled()
    with pytest.raises(ValueError, match="does not require grad"):
        w.sum().backward()


def test_no_grad_is_per_thread():
    """One thread decoding under no_grad() must not stop another from recording its graph (as in PyTorch)."""
    import threading

    inside, done = threading.Event(), threading.Event()

    def decode():
        with no_grad():
            inside.set()
            done.wait(10)

    t = threading.Thread(target=decode)
    t.start()
    inside.wait(10)
    try:
        assert ag.is_grad_enabled()
        x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
        (x * x).sum().backward()
        np.testing.assert_array_equal(x.grad, [2.0, 4.0])
    finally:
        done.set()
        t.join()


def test_no_grad_restores_mode_after_an_error():
    with pytest.raises(RuntimeError):
        with no_grad():
            raise RuntimeError("boom")
    assert ag.is_grad_enabled()


def test_constants_get_no_gradient():
    x = Tensor(np.ones(2), requires_grad=True)
    c = Tensor(np.full(2, 4.0))
    (x * c).sum().backward()
    assert c.grad is None
    np.testing.assert_array_equal(x.grad, [4.0, 4.0])


def test_retain_grad_keeps_intermediate_gradient():
    x = Tensor(np.array([1.0, 2.0]), requires_grad=True)
    h = (x * 3.0).retain_grad()
    other = x * 3.0
    (h * h + other).sum().backward()
    np.testing.assert_allclose(h.grad, 2 * h.data)
    assert other.grad is None


# ----------------------------------------------------------------------------
# Bad input
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("call,error,match", [
    (lambda: ag.cross_entropy(Tensor(np.zeros((2, 3))), np.array([0.0, 1.0])), TypeError, "integers.*float64"),
    (lambda: ag.cross_entropy(Tensor(np.zeros((2, 3))), np.array([0, 3])), ValueError, r"target id 3 .*\[0, 3\)"),
    (lambda: ag.cross_entropy(Tensor(np.zeros((2, 3))), np.array([0, 1, 2])), ValueError, r"\(3,\).*\(2,\)"),
    (lambda: ag.matmul(Tensor(np.zeros(3)), Tensor(np.zeros((3, 2)))), ValueError, r"\(3,\)"),
    (lambda: ag.pow(Tensor(np.ones(2)), Tensor(np.ones(2))), TypeError, "scalar exponent"),
    (lambda: ag.rpow(Tensor(np.ones(2)), Tensor(np.ones(2))), TypeError, "scalar base.*Tensor"),
    (lambda: "2" ** Tensor(np.ones(2)), TypeError, "scalar base.*str"),
    (lambda: np.exp(Tensor(np.ones(2), requires_grad=True)), TypeError, "requires grad.*drop its gradient"),
    (lambda: ag.masked_fill(Tensor(np.ones(2)), np.array([1, 0]), 0.0), TypeError, "bool mask"),
    (lambda: ag.split(Tensor(np.ones(5)), 2), ValueError, "size 5 into 2"),
    (lambda: Tensor(np.array([1, 2]), requires_grad=True, dtype=np.int64), TypeError, "int64"),
    (lambda: Tensor(np.ones(3), requires_grad=True).backward(), ValueError, r"scalar.*\(3,\)"),
    (lambda: Tensor(np.ones(3), requires_grad=True).backward(np.ones(2)), ValueError, r"\(2,\).*\(3,\)"),
])
def test_bad_input_names_the_value(call, error, match):
    with pytest.raises(error, match=match) as info:
        call()
    assert "\n" not in str(info.value)


# ----------------------------------------------------------------------------
# Edges a learner reaches: negative axes, a second backward, non-numbers
# ----------------------------------------------------------------------------

def test_transpose_with_negative_axes_has_the_inverse_permutation_as_gradient():
    torch = pytest.importorskip("torch")
    w = np.arange(24.0).reshape(2, 4, 3)
    x = Tensor(np.random.default_rng(0).standard_normal((2, 3, 4)), requires_grad=True)
    (x.transpose(0, -1, -2) * w).sum().backward()
    tx = torch.tensor(x.data, requires_grad=True)
    (tx.permute(0, -1, -2) * torch.tensor(w)).sum().backward()
    np.testing.assert_array_equal(x.grad, tx.grad.numpy())
    with pytest.raises(ValueError, match="not a permutation"):
        x.transpose(0, 1)


def test_a_second_backward_through_a_freed_graph_is_an_error_not_a_silent_no_op():
    x = Tensor([1.0, 2.0], requires_grad=True)
    h = x * 2.0
    h.sum().backward()
    with pytest.raises(ValueError, match="already freed"):
        (h * 3.0).sum().backward()
    y = (x * x).sum()
    y.backward()
    with pytest.raises(ValueError, match="already freed"):
        y.backward()
    np.testing.assert_array_equal(x.grad, [2 + 2, 2 + 4])              # the refused passes added nothing


@pytest.mark.parametrize("call, error, match", [
    (lambda: Tensor(np.arange(6.0).reshape(2, 3)).sum(axis=2), ValueError, "axis 2 is out of range"),
    (lambda: Tensor(np.arange(6.0).reshape(2, 3)).mean(axis=-3), ValueError, "axis -3 is out of range"),
    (lambda: Tensor(None), TypeError, "a Tensor holds numbers"),
    (lambda: Tensor("abc"), TypeError, "got a str"),
    (lambda: Tensor([1.0, 2.0]) + None, TypeError, "got NoneType"),
    (lambda: Tensor([1.0, 2.0]) * "2", TypeError, "got str"),
    (lambda: ag.split(Tensor(np.arange(5.0)), [2, 2]), ValueError, "add up to the axis' size 5"),
    (lambda: ag.embedding(Tensor(np.zeros((3, 2))), np.array([-1])), ValueError, "embedding id -1"),
    (lambda: ag.cross_entropy(Tensor([[1, 2]]), np.array([0])), TypeError, "floating-point logits"),
    # shapes that NumPy would broadcast into a wrong answer, and dtypes it would reinterpret
    (lambda: kernels.attention(Tensor(np.zeros((2, 2, 3, 4))), Tensor(np.zeros((1, 1, 3, 4))),
                          Tensor(np.zeros((1, 1, 3, 4))), None, 0.5), ValueError, r"k \(1, 1, 3, 4\)"),
    (lambda: kernels.attention(Tensor(np.zeros((1, 3, 3, 4))), Tensor(np.zeros((1, 2, 3, 4))),
                          Tensor(np.zeros((1, 2, 3, 4))), None, 0.5), ValueError, "H a multiple of G"),
    (lambda: kernels.attention(Tensor(np.zeros((1, 2, 3, 4))), Tensor(np.zeros((1, 1, 3, 4))),
                          Tensor(np.zeros((1, 1, 3, 4))), np.zeros((3, 3)), 0.5), TypeError, "bool mask"),
    (lambda: kernels.rms_norm(Tensor(np.ones((2, 4))), Tensor(np.ones(1)), 1e-5), ValueError, r"weight \(1,\)"),
    (lambda: kernels.rms_norm(Tensor(np.ones((2, 4), dtype=int)), Tensor(np.ones(4)), 1e-5), ValueError,
     "floating-point x"),
    (lambda: ag.rope(Tensor(np.arange(8).reshape(2, 4)), np.ones((2, 2)), np.zeros((2, 2))), TypeError,
     "floating-point x"),
    (lambda: ag.masked_fill(Tensor(np.zeros(3)), np.zeros((2, 4), dtype=bool), 1.0), ValueError,
     r"mask of shape \(2, 4\) does not broadcast with the tensor's shape \(3,\)"),
    (lambda: kernels.attention(Tensor(np.zeros((1, 2, 3, 4))), Tensor(np.zeros((1, 1, 3, 4))),
                          Tensor(np.zeros((1, 1, 3, 4))), np.zeros((1, 2, 3, 3), dtype=bool), 0.5), ValueError,
     r"mask of shape \(1, 2, 3, 3\) does not broadcast to \(B, 1, n, m\)"),
    (lambda: kernels.attention(Tensor(np.zeros((1, 2, 3, 4))), Tensor(np.zeros((1, 1, 3, 4))),
                          Tensor(np.zeros((1, 1, 3, 4))), np.zeros((2, 1, 3, 3), dtype=bool), 0.5), ValueError,
     "does not broadcast to"),
    (lambda: ag.split(Tensor(np.zeros(4)), 2, axis=5), ValueError, "axis 5 is out of range"),
    (lambda: ag.repeat_interleave(Tensor(np.zeros(2)), 0, 0), ValueError, "repeats must be >= 1, got 0"),
])
def test_bad_arguments_are_named_errors(call, error, match):
    with pytest.raises(error, match=match):
        call()


def test_zero_dim_and_integer_inputs_and_x_to_the_zero():
    torch = pytest.importorskip("torch")
    assert float(Tensor(3.0).sum(axis=0).data) == 3.0
    np.testing.assert_allclose(ag.sigmoid(Tensor([1.0, 2.0]).sum()).data, torch.sigmoid(torch.tensor(3.0)).item(),
                               rtol=1e-6)
    np.testing.assert_allclose(ag.silu(Tensor([1, 2])).data,                # integers compute in float64
                               torch.nn.functional.silu(torch.tensor([1.0, 2.0], dtype=torch.float64)).numpy(),
                               rtol=1e-12)
    z = Tensor(np.array([0.0, 1.0]), requires_grad=True)
    (z ** 0).sum().backward()
    np.testing.assert_array_equal(z.grad, [0.0, 0.0])                    # torch: [0, 0]; not 0 * 0**-1 = nan


def test_transpose_takes_its_axes_as_a_tuple_too_and_split_an_int_of_numpy():
    x = Tensor(np.arange(6.0).reshape(2, 3))
    np.testing.assert_array_equal(x.transpose((1, 0)).data, x.data.T)
    np.testing.assert_array_equal(x.transpose(1, 0).data, x.data.T)
    assert [p.shape for p in ag.split(x, np.int64(3), axis=-1)] == [(2, 1)] * 3


def test_backward_of_a_leaf_keeps_its_own_copy_of_the_gradient():
    x = Tensor(np.zeros(3), requires_grad=True)
    g = np.ones(3)
    x.backward(g)
    g[0] = 5.0                                                           # the caller's array, changed later
    assert x.grad.tolist() == [1.0, 1.0, 1.0] and x.grad is not g


def test_an_op_that_returns_a_gradient_of_the_wrong_shape_is_caught():
    """The engine's guard: a leaf never silently receives a gradient of another shape."""
    x = Tensor(np.ones(3), requires_grad=True)
    bad = ag.make_op(x.data * 2, (x,), lambda g: (np.ones((2, 3)),))     # an op whose backward broadcasts wrongly
    with pytest.raises(ValueError, match=r"gradient of shape \(2, 3\) for a tensor of shape \(3,\)"):
        bad.sum().backward()
    assert x.grad is None


def test_masked_fill_broadcasts_the_tensor_up_to_the_mask_as_pytorch_does():
    torch = pytest.importorskip("torch")
    mask = np.random.default_rng(0).random((2, 3, 4)) < 0.5
    a = Tensor(np.arange(4.0), requires_grad=True)
    out = ag.masked_fill(a, mask, -1.0)
    t = torch.arange(4.0, dtype=torch.float64, requires_grad=True)
    want = t.masked_fill(torch.from_numpy(mask), -1.0)
    np.testing.assert_array_equal(out.data, want.detach().numpy())
    out.sum().backward()
    want.sum().backward()
    np.testing.assert_array_equal(a.grad, t.grad.numpy())


def test_log_softmax_of_integers_computes_in_float64():
    np.testing.assert_allclose(ag.log_softmax(Tensor([[1, 2, 3]])).data, np.log(softmax_np(np.array([[1.0, 2, 3]]))),
                               rtol=1e-15)


def test_log_softmax_of_a_row_with_nothing_to_choose():
    """Like softmax_np: an all -inf row gives -inf (softmax 0), no NaN, and no gradient."""
    a = Tensor(np.array([[0.0, 1.0], [-np.inf, -np.inf]]), requires_grad=True)
    out = ag.log_softmax(a)
    assert np.isneginf(out.data[1]).all() and np.isfinite(out.data[0]).all()
    np.testing.assert_allclose(np.exp(out.data), softmax_np(a.data), rtol=1e-15)
    out.backward(np.ones((2, 2)))
    np.testing.assert_array_equal(a.grad[1], [0.0, 0.0])
    np.testing.assert_allclose(a.grad[0], 1 - 2 * softmax_np(a.data[0]), rtol=1e-15)


def test_a_leaf_gradient_keeps_the_leafs_dtype_however_it_is_reached():
    x = Tensor(np.ones(3, dtype=np.float32), requires_grad=True)
    c = Tensor(np.full(3, 2.0))                                          # float64
    (x * c + x * c).sum().backward()
    (x * c).sum().backward()
    assert x.grad.dtype == np.float32 and x.grad.tolist() == [6.0, 6.0, 6.0]


def test_clipping_a_nan_norm_spreads_it_as_pytorch_does():
    torch = pytest.importorskip("torch")
    from glassllm.optim import AdamW, clip_grad_norm

    a, b = Tensor(np.ones(2), requires_grad=True), Tensor(np.ones(2), requires_grad=True)
    a.grad, b.grad = np.array([np.nan, 1.0]), np.array([100.0, 100.0])
    ta, tb = torch.ones(2, requires_grad=True), torch.ones(2, requires_grad=True)
    ta.grad, tb.grad = torch.tensor([float("nan"), 1.0]), torch.tensor([100.0, 100.0])
    assert np.isnan(clip_grad_norm([a, b], 1.0)) and np.isnan(torch.nn.utils.clip_grad_norm_([ta, tb], 1.0).item())
    assert np.isnan(b.grad).all() and torch.isnan(tb.grad).all()
    p = Tensor(np.ones((2, 2)), requires_grad=True)
    p.grad = np.ones(2)
    with pytest.raises(ValueError, match=r"gradient of 'w' has shape \(2,\), the parameter \(2, 2\)"):
        AdamW([("w", p)]).step()


@pytest.mark.parametrize("base", [0.0, -2.0])
def test_rpow_edge_bases_match_torch(base):
    """0 ** a and (-2) ** a, values and gradients, where they are inf, 0, NaN or exact (PyTorch's rules)."""
    torch = pytest.importorskip("torch")
    a = np.array([-1.5, -1.0, 0.0, 0.5, 2.0])
    t = Tensor(a, requires_grad=True)
    with np.errstate(divide="ignore", invalid="ignore"):
        y = base ** t
    y.backward(np.ones_like(a))
    tt = torch.tensor(a, requires_grad=True)
    yy = base ** tt
    yy.backward(torch.ones_like(tt))
    np.testing.assert_array_equal(y.data, yy.detach().numpy())
    np.testing.assert_array_equal(t.grad, tt.grad.numpy())


def test_numpy_sees_a_tensor_outside_any_graph_as_its_numbers():
    t = Tensor(np.arange(3.0, dtype=np.float32))
    assert np.asarray(t) is t.data                                       # no copy unless asked
    np.testing.assert_array_equal(np.exp(t), np.exp(t.data))
    assert np.asarray(t, dtype=np.float64).dtype == np.float64
    assert np.array(t) is not t.data                                     # np.array copies
    with pytest.raises(ValueError, match="float64 without a copy"):
        np.asarray(t, dtype=np.float64, copy=False)
    # Arithmetic with an ndarray on the left still builds the graph.
    w = Tensor(np.ones(3), requires_grad=True)
    out = (np.arange(3.0) * w).sum() + (np.float32(2) ** w).sum() + np.float64(3) * w.sum()
    out.backward()
    np.testing.assert_allclose(w.grad, np.arange(3.0) + 2.0 * np.log(2.0) + 3.0)
