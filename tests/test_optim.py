"""AdamW, the schedule and clipping against hand-derived numbers and PyTorch (float64).

The whole-model training parity (20 steps with accumulation and clipping)
lives in ``test_train.py``; here each piece is checked on its own.
"""

from __future__ import annotations

import doctest
import math

import numpy as np
import pytest

from glassllm import optim
from glassllm.autograd import Tensor
from glassllm.optim import AdamW, clip_grad_norm, decay_mask, global_norm, lr_at


def test_doctests():
    assert doctest.testmod(optim).failed == 0


# ----------------------------------------------------------------------------
# Schedule
# ----------------------------------------------------------------------------

def test_schedule_hand_values():
    # peak 1, warm-up 4, 10 steps, floor 0.1
    lrs = [lr_at(s, 1.0, warmup=4, total=10, min_lr=0.1) for s in range(11)]
    assert lrs[:4] == [0.25, 0.5, 0.75, 1.0]                      # (s+1)/4
    assert lrs[4] == 1.0                                          # cosine starts at the peak
    assert lrs[7] == pytest.approx(0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * 3 / 6)))  # = 0.55
    assert lrs[7] == pytest.approx(0.55)
    assert lrs[10] == pytest.approx(0.1)                          # floor at the end
    assert lr_at(50, 1.0, 4, 10, 0.1) == pytest.approx(0.1)       # and after it


def test_schedule_without_warmup_starts_at_peak():
    assert lr_at(0, 3e-3, 0, 100) == 3e-3


def test_schedule_matches_torch_lambdalr():
    torch = pytest.importorskip("torch")
    p = torch.nn.Parameter(torch.zeros(1, dtype=torch.float64))
    opt = torch.optim.SGD([p], lr=2e-3)
    sched = torch.optim.lr_scheduler.LambdaLR(opt, optim.lr_lambda(2e-3, 5, 30, 2e-4))
    for s in range(35):
        assert opt.param_groups[0]["lr"] == pytest.approx(lr_at(s, 2e-3, 5, 30, 2e-4), rel=1e-12)
        opt.step()
        sched.step()


# ----------------------------------------------------------------------------
# Clipping
# ----------------------------------------------------------------------------

def _params_with_grads(rng, shapes, scale):
    ps = []
    for shape in shapes:
        p = Tensor(rng.standard_normal(shape), requires_grad=True, dtype=np.float64)
        p.grad = scale * rng.standard_normal(shape)
        ps.append(p)
    return ps


def test_global_norm_hand_value():
    a = Tensor(np.zeros(2), requires_grad=True, dtype=np.float64)
    b = Tensor(np.zeros((1, 1)), requires_grad=True, dtype=np.float64)
    a.grad, b.grad = np.array([3.0, 0.0]), np.array([[4.0]])
    assert global_norm([a, b]) == 5.0
    assert clip_grad_norm([a, b], 1.0) == 5.0                    # returns the norm before clipping
    assert np.allclose(a.grad, [0.6, 0.0]) and np.allclose(b.grad, [[0.8]])   # scaled by ~1/5
    assert clip_grad_norm([a, b], 10.0) == pytest.approx(1.0)     # below the limit: untouched
    assert np.allclose(a.grad, [0.6, 0.0])


def test_global_norm_of_huge_float32_gradients_is_finite():
    # 3e19 squared overflows float32; the norm must still be the true one, so that only
    # a gradient that really is inf or NaN stops a training step.
    a = Tensor(np.zeros(2, dtype=np.float32), requires_grad=True)
    a.grad = np.array([3e19, 4e19], dtype=np.float32)
    assert global_norm([a]) == pytest.approx(5e19, rel=1e-6)
    a.grad = np.array([3e19, np.inf], dtype=np.float32)
    assert global_norm([a]) == np.inf


@pytest.mark.parametrize("max_norm", [0.5, 1e3])
def test_clip_matches_torch(max_norm):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    ps = _params_with_grads(rng, [(3, 4), (5,), (2, 2, 2)], scale=1.0)
    tps = []
    for p in ps:
        t = torch.nn.Parameter(torch.tensor(p.data))
        t.grad = torch.tensor(p.grad.copy())
        tps.append(t)
    ours = clip_grad_norm(ps, max_norm)
    theirs = torch.nn.utils.clip_grad_norm_(tps, max_norm).item()
    assert ours == pytest.approx(theirs, rel=1e-14)
    for p, t in zip(ps, tps):
        np.testing.assert_allclose(p.grad, t.grad.numpy(), rtol=1e-14, atol=0)


# ----------------------------------------------------------------------------
# AdamW
# ----------------------------------------------------------------------------

def test_adamw_first_step_hand_derived():
    # At t=1: m = (1-b1) g, v = (1-b2) g^2, so m_hat = g, v_hat = g^2 and the
    # step is lr * g / (|g| + eps) -- about lr * sign(g) -- after decay p *= 1 - lr*wd.
    w = Tensor(np.array([[1.0, -2.0]]), requires_grad=True, dtype=np.float64)   # a matrix: decayed
    n = Tensor(np.array([1.0, 1.0]), requires_grad=True, dtype=np.float64)      # a vector: not decayed
    w.grad, n.grad = np.array([[0.5, -4.0]]), np.array([2.0, 0.0])
    opt = AdamW([("w", w), ("n", n)], lr=0.1, betas=(0.9, 0.99), eps=1e-8, weight_decay=0.5)
    opt.step()
    np.testing.assert_allclose(w.data, [[1.0 * 0.95 - 0.1 * 0.5 / (0.5 + 1e-8),
                                         -2.0 * 0.95 + 0.1 * 4.0 / (4.0 + 1e-8)]], rtol=1e-15)
    np.testing.assert_allclose(n.data, [1.0 - 0.1 * 2.0 / (2.0 + 1e-8), 1.0], rtol=1e-15)


def test_decay_mask_spares_norms():
    from glassllm.config import ModelConfig
    from glassllm.nn import Transformer

    mask = decay_mask(Transformer(ModelConfig(n_layers=2)).named_parameters())
    assert {k for k, v in mask.items() if not v} == {
        "layers.0.attention_norm.weight", "layers.0.ffn_norm.weight",
        "layers.1.attention_norm.weight", "layers.1.ffn_norm.weight", "norm.weight"}
    assert mask["tok_embeddings.weight"] and mask["output.weight"] and mask["layers.1.feed_forward.w2.weight"]


def test_adamw_matches_torch_param_groups():
    """30 steps with a changing lr; matrices in the decayed group, the vector not."""
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(3)
    shapes = {"a.weight": (4, 3), "b.weight": (6,), "c.weight": (2, 5)}
    ours = {k: Tensor(rng.standard_normal(s), requires_grad=True, dtype=np.float64) for k, s in shapes.items()}
    theirs = {k: torch.nn.Parameter(torch.tensor(v.data.copy())) for k, v in ours.items()}
    opt = AdamW(ours.items(), lr=1e-2, betas=(0.8, 0.9), eps=1e-6, weight_decay=0.3)
    topt = torch.optim.AdamW(
        [{"params": [theirs["a.weight"], theirs["c.weight"]], "weight_decay": 0.3},
         {"params": [theirs["b.weight"]], "weight_decay": 0.0}],
        lr=1e-2, betas=(0.8, 0.9), eps=1e-6, foreach=False)
    for step in range(30):
        lr = 1e-2 * (1 + step) / 30
        opt.lr = lr
        for g in topt.param_groups:
            g["lr"] = lr
        opt.zero_grad()
        topt.zero_grad(set_to_none=True)
        for k, p in ours.items():
            g = rng.standard_normal(shapes[k])
            p.grad = g
            theirs[k].grad = torch.tensor(g.copy())
        opt.step()
        topt.step()
        for k in shapes:
            np.testing.assert_allclose(ours[k].data, theirs[k].detach().numpy(), rtol=1e-12, atol=1e-14)
    # The moments agree too (names mirror the parameters).
    state = opt.state_dict()
    for k in ("a.weight", "b.weight"):
        np.testing.assert_allclose(state["m"][k], topt.state[theirs[k]]["exp_avg"].numpy(), rtol=1e-12)
        np.testing.assert_allclose(state["v"][k], topt.state[theirs[k]]["exp_avg_sq"].numpy(), rtol=1e-12)


def test_adamw_state_round_trip_is_exact():
    rng = np.random.default_rng(1)
    make = lambda: Tensor(rng.standard_normal((3, 3)).astype(np.float32), requires_grad=True)  # noqa: E731
    p, q = make(), make()
    q.data = p.data.copy()
    a, b = AdamW([("w", p)], lr=1e-2), AdamW([("w", q)], lr=1e-2)
    grads = [rng.standard_normal((3, 3)).astype(np.float32) for _ in range(6)]
    for g in grads[:3]:
        p.grad = g.copy()
        a.step()
    b.load_state_dict({k: (v if k == "t" else {n: arr.copy() for n, arr in v.items()})
                       for k, v in a.state_dict().items()})
    q.data = p.data.copy()
    for g in grads[3:]:
        p.grad, q.grad = g.copy(), g.copy()
        a.step()
        b.step()
    assert np.array_equal(p.data, q.data)


@pytest.mark.parametrize("kwargs, match", [
    ({"betas": (1.0, 0.9)}, "beta1"), ({"betas": (0.9, -0.1)}, "beta2"),
    ({"eps": 0.0}, "eps"), ({"weight_decay": -1.0}, "weight_decay"),
])
def test_adamw_rejects_bad_hyperparameters(kwargs, match):
    p = Tensor(np.zeros((2, 2)), requires_grad=True)
    with pytest.raises(ValueError, match=match):
        AdamW([("w", p)], **kwargs)


def test_adamw_rejects_mismatched_state():
    p = Tensor(np.zeros((2, 2)), requires_grad=True)
    opt = AdamW([("w", p)])
    with pytest.raises(ValueError, match=r"m\['w'\] has shape \(3,\)"):
        opt.load_state_dict({"t": 1, "m": {"w": np.zeros(3)}, "v": {"w": np.zeros((2, 2))}})
    with pytest.raises(ValueError, match="missing"):
        opt.load_state_dict({"t": 1, "m": {}, "v": {}})
    with pytest.raises(ValueError, match="step"):
        opt.load_state_dict({"t": -1, "m": {"w": np.zeros((2, 2))}, "v": {"w": np.zeros((2, 2))}})


def test_adamw_takes_a_dict_of_named_parameters_too():
    from glassllm.autograd import Tensor
    from glassllm.optim import AdamW

    w = Tensor(np.ones((2, 2)), requires_grad=True)
    for given in ({"wq": w}, [("wq", w)], iter([("wq", w)])):
        assert list(AdamW(given).params) == ["wq"]
