"""Sampling: temperature, top-k, top-p and the draw.

References: hand-derived numbers; Hugging Face's own logits warpers (the
temperature, top-k and top-p processors ``model.generate`` uses, in float64);
and a chi-square goodness-of-fit test of the draws, which is shown to reject
a sampler that applies the temperature the wrong way round.
"""

from __future__ import annotations

import math
from statistics import NormalDist

import numpy as np
import pytest

from glassllm.sampling import (
    ParameterTypeError, SamplingConfig, model_probs, sample, sampling_distribution,
)

LOGITS4 = np.array([2.0, 1.0, 0.0, -1.0])


def softmax(z):
    e = np.exp(np.asarray(z, dtype=np.float64) - np.max(z))
    return e / e.sum()


# ----------------------------------------------------------------------------
# Hand-derived distributions
# ----------------------------------------------------------------------------

def test_temperature_one_is_the_models_softmax():
    e = np.exp([2.0, 1.0, 0.0, -1.0])
    np.testing.assert_allclose(sampling_distribution(LOGITS4), e / e.sum(), rtol=1e-15)
    np.testing.assert_allclose(model_probs(LOGITS4), e / e.sum(), rtol=1e-15)


def test_temperature_divides_the_logits():
    # T = 2: softmax([1, 0.5, 0, -0.5]); T = 0.5: softmax([4, 2, 0, -2]).
    for t, scaled in ((2.0, [1.0, 0.5, 0.0, -0.5]), (0.5, [4.0, 2.0, 0.0, -2.0])):
        e = np.exp(scaled)
        np.testing.assert_allclose(sampling_distribution(LOGITS4, t), e / e.sum(), rtol=1e-14)


def test_top_k_renormalises_over_the_survivors_only():
    # k = 2 keeps ids 0 and 1: e^2 / (e^2 + e) and e / (e^2 + e).
    d = sampling_distribution(LOGITS4, 1.0, top_k=2)
    a, b = math.exp(2), math.exp(1)
    np.testing.assert_allclose(d, [a / (a + b), b / (a + b), 0.0, 0.0], rtol=1e-15)
    assert d[2] == 0.0 and d[3] == 0.0  # exactly zero, not tiny


def test_top_p_keeps_the_smallest_prefix_reaching_p():
    p = softmax(LOGITS4)  # [0.6439, 0.2369, 0.0871, 0.0321]
    # p = 0.5: the top id alone already has 0.64 >= 0.5.
    assert sampling_distribution(LOGITS4, 1.0, top_p=0.5).tolist() == [1.0, 0.0, 0.0, 0.0]
    # p = 0.8: 0.64 < 0.8, 0.64 + 0.24 = 0.88 >= 0.8 -> two ids.
    np.testing.assert_allclose(sampling_distribution(LOGITS4, 1.0, top_p=0.8),
                               [p[0] / (p[0] + p[1]), p[1] / (p[0] + p[1]), 0, 0], rtol=1e-15)
    # p = 0.95: three ids (0.968 >= 0.95).
    kept = sampling_distribution(LOGITS4, 1.0, top_p=0.95)
    np.testing.assert_allclose(kept, np.r_[p[:3] / p[:3].sum(), 0.0], rtol=1e-15)
    # A p below the rounding tolerance (even the smallest float) still keeps the top id, never nothing.
    for tiny_p in (1e-13, 5e-324):
        assert sampling_distribution(LOGITS4, 1.0, top_p=tiny_p).tolist() == [1.0, 0.0, 0.0, 0.0]
    # p = 1 keeps everything, even ids of vanishing probability.
    tiny = np.array([0.0, -700.0])
    assert sampling_distribution(tiny, 1.0, top_p=1.0)[1] > 0


def test_top_k_then_top_p_order():
    # Top-p runs on the top-k survivors *renormalised*: with k = 2 the two ids
    # have 0.731 / 0.269, so p = 0.7 keeps one id. Top-p first (on the full
    # distribution, 0.644 < 0.7) would have kept two.
    assert sampling_distribution(LOGITS4, 1.0, top_k=2, top_p=0.7).tolist() == [1.0, 0.0, 0.0, 0.0]


def test_greedy_is_a_point_mass_on_the_first_argmax():
    z = np.array([0.5, 3.0, -1.0, 3.0])
    assert sampling_distribution(z, 0).tolist() == [0.0, 1.0, 0.0, 0.0]
    assert sampling_distribution(z, 0.0, top_k=1, top_p=0.1).tolist() == [0.0, 1.0, 0.0, 0.0]


def test_ties_at_the_kth_logit_all_survive():
    z = np.array([1.0, 2.0, 2.0, 0.0])
    d = sampling_distribution(z, 1.0, top_k=1)
    np.testing.assert_allclose(d, [0.0, 0.5, 0.5, 0.0])


def test_tiny_and_huge_temperatures_stay_finite():
    z = np.array([1.0, 0.999, -3.0])
    assert sampling_distribution(z, 1e-300).tolist() == [1.0, 0.0, 0.0]
    np.testing.assert_allclose(sampling_distribution(z, 1e300), np.full(3, 1 / 3), rtol=1e-12)


def test_masked_ids_keep_zero_probability():
    z = np.array([0.0, -np.inf, 1.0])
    d = sampling_distribution(z, 2.0)
    assert d[1] == 0.0 and np.isclose(d.sum(), 1.0)


def test_batched_rows_match_single_rows(rng):
    z = rng.normal(size=(3, 50)) * 2
    batch = sampling_distribution(z, 0.7, top_k=20, top_p=0.8)
    for row, zr in zip(batch, z):
        np.testing.assert_array_equal(row, sampling_distribution(zr, 0.7, top_k=20, top_p=0.8))


# ----------------------------------------------------------------------------
# Against Hugging Face's warpers
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.3, 1.0, 1.7])
@pytest.mark.parametrize("top_k", [None, 1, 7, 100, 1024])
@pytest.mark.parametrize("top_p", [None, 5e-324, 1e-13, 0.2, 0.9, 1.0])
def test_matches_hugging_face_warpers(temperature, top_k, top_p):
    torch = pytest.importorskip("torch")
    lp = pytest.importorskip("transformers.generation.logits_process")
    rng = np.random.default_rng(7)
    z = rng.normal(size=(4, 1024)) * 3.0                                  # (B, V)
    scores = torch.tensor(z, dtype=torch.float64)
    # Hugging Face applies them in this order in generate(): temperature, top-k, top-p.
    scores = lp.TemperatureLogitsWarper(temperature)(None, scores)
    if top_k is not None:
        scores = lp.TopKLogitsWarper(top_k)(None, scores)
    if top_p is not None:
        scores = lp.TopPLogitsWarper(top_p)(None, scores)
    expected = torch.softmax(scores, dim=-1).numpy()
    ours = sampling_distribution(z, temperature, top_k, top_p)
    np.testing.assert_array_equal(ours > 0, expected > 0)                 # the same survivors
    np.testing.assert_allclose(ours, expected, rtol=1e-12, atol=1e-300)


# ----------------------------------------------------------------------------
# The draw
# ----------------------------------------------------------------------------

def chi_square(counts: np.ndarray, probs: np.ndarray) -> tuple[float, int]:
    """Pearson's statistic over the support of ``probs``, pooling cells expected < 5.

    Draws outside the support make the statistic infinite. Returns (statistic, df).
    """
    total = counts.sum()
    if counts[probs == 0].sum() > 0:
        return math.inf, 1
    expected = probs * total
    order = np.flatnonzero(probs > 0)
    order = order[np.argsort(expected[order])]
    small = order[expected[order] < 5]
    big = order[expected[order] >= 5]
    obs = list(counts[big])
    exp = list(expected[big])
    if len(small):
        obs.append(counts[small].sum())
        exp.append(expected[small].sum())
    obs, exp = np.array(obs, dtype=np.float64), np.array(exp)
    return float(((obs - exp) ** 2 / exp).sum()), len(obs) - 1


def chi2_critical(df: int, alpha: float) -> float:
    """Upper ``alpha`` quantile of chi-square(df), Wilson-Hilferty (good to ~1% for df >= 3)."""
    z = NormalDist().inv_cdf(1 - alpha)
    return df * (1 - 2 / (9 * df) + z * math.sqrt(2 / (9 * df))) ** 3


def test_chi2_critical_against_known_table_values():
    # chi-square 0.999 quantiles from standard tables: df=10 -> 29.588, df=30 -> 59.703.
    assert chi2_critical(10, 0.001) == pytest.approx(29.588, rel=0.01)
    assert chi2_critical(30, 0.001) == pytest.approx(59.703, rel=0.01)


DRAWS = 200_000
CASES = [  # (temperature, top_k, top_p)
    (0.7, 40, None),
    (1.3, None, None),
    (0.8, 100, 0.9),
]


def fixed_logits() -> np.ndarray:
    return np.random.default_rng(2024).normal(size=1024) * 2.0         # (V,)


def wrong_temperature_sampler(z, temperature, top_k, top_p, rng, size):
    """A deliberate bug: logits * T instead of logits / T; the filters are right."""
    probs = sampling_distribution(z * temperature, 1.0, top_k, top_p)
    return sample(probs, rng, size=size)


@pytest.mark.parametrize("temperature,top_k,top_p", CASES)
def test_draws_follow_the_distribution(temperature, top_k, top_p):
    z = fixed_logits()
    probs = sampling_distribution(z, temperature, top_k, top_p)
    alpha = 1e-3

    ids = sample(probs, np.random.default_rng(11), size=DRAWS)
    counts = np.bincount(ids, minlength=1024)
    stat, df = chi_square(counts, probs)
    assert df >= 10, "too few cells for a meaningful test"
    assert stat < chi2_critical(df, alpha), f"chi2={stat:.1f} with df={df}: draws do not follow the distribution"

    # The same statistic, the same number of draws, must reject a sampler that
    # applies the temperature wrongly.
    bad = wrong_temperature_sampler(z, temperature, top_k, top_p, np.random.default_rng(11), DRAWS)
    bad_stat, bad_df = chi_square(np.bincount(bad, minlength=1024), probs)
    assert bad_stat > chi2_critical(bad_df, alpha) * 10


def test_filtered_ids_are_never_drawn():
    z = fixed_logits()
    probs = sampling_distribution(z, 1.0, top_k=3)
    ids = sample(probs, np.random.default_rng(0), size=50_000)
    assert set(np.unique(ids)) == set(np.argsort(-z)[:3])


def test_same_generator_state_same_draws_and_batched_rows():
    z = np.random.default_rng(3).normal(size=(2, 30))
    probs = sampling_distribution(z, 1.0)
    a = sample(probs, np.random.default_rng(5))
    rng = np.random.default_rng(5)
    b = [sample(probs[0], rng), sample(probs[1], rng)]  # one uniform per draw, in row order
    assert a.tolist() == b


def test_draw_at_the_top_of_the_unit_interval_lands_on_a_possible_id():
    class TopOfRange(np.random.Generator):
        def random(self, size=None):
            return np.nextafter(1.0, 0.0) if size is None else np.full(size, np.nextafter(1.0, 0.0))

    rng = TopOfRange(np.random.PCG64(0))
    probs = np.array([0.3, 0.7, 0.0, 0.0])
    assert sample(probs, rng) == 1
    assert sample(np.array([[0.5, 0.5, 0.0]]), rng).tolist() == [1]


# ----------------------------------------------------------------------------
# Bad parameters: one line, naming the value
# ----------------------------------------------------------------------------

BAD = [
    dict(temperature=float("nan")), dict(temperature=float("inf")), dict(temperature=-0.1),
    dict(temperature="1"), dict(temperature=True), dict(temperature=None),
    dict(top_k=0), dict(top_k=1025), dict(top_k=-3), dict(top_k=2.0), dict(top_k=True), dict(top_k="5"),
    dict(top_p=0.0), dict(top_p=1.5), dict(top_p=-0.2), dict(top_p=float("nan")), dict(top_p="0.9"),
    dict(top_p=True),
]


@pytest.mark.parametrize("bad", BAD, ids=lambda d: f"{next(iter(d))}={next(iter(d.values()))!r}")
def test_bad_parameters_raise_one_line(bad):
    kwargs = dict(temperature=1.0, top_k=None, top_p=None) | bad
    with pytest.raises(ValueError) as e:
        sampling_distribution(np.zeros(1024), **kwargs)
    msg = str(e.value)
    assert "\n" not in msg and next(iter(bad)) in msg
    with pytest.raises(ValueError):
        SamplingConfig(**kwargs, vocab_size=1024)


def test_wrong_types_are_type_errors_too():
    with pytest.raises(TypeError):
        sampling_distribution(np.zeros(4), temperature="hot")
    assert issubclass(ParameterTypeError, ValueError) and issubclass(ParameterTypeError, TypeError)


@pytest.mark.parametrize("logits", [np.array([0.0, np.nan]), np.array([np.inf, 0.0]),
                                    np.array([-np.inf, -np.inf]), np.zeros((0,)), np.zeros((2, 2, 2))])
def test_broken_logits_are_refused(logits):
    with pytest.raises(ValueError):
        sampling_distribution(logits)


def test_config_is_frozen_and_normalised():
    c = SamplingConfig(temperature=np.float32(0.5), top_k=np.int64(3), top_p=1, vocab_size=10)
    assert (type(c.temperature), type(c.top_k), type(c.top_p)) == (float, int, float)
    assert not c.greedy and SamplingConfig(temperature=0).greedy
    with pytest.raises(Exception):
        c.temperature = 2.0
    np.testing.assert_array_equal(c.distribution(LOGITS4.repeat(3)[:10]),
                                  sampling_distribution(LOGITS4.repeat(3)[:10], 0.5, 3, 1.0))
