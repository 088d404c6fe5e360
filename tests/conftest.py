"""Shared fixtures: model configs of several shapes, seeded weights, a teaching-path tracer.

Fixtures that return *factories* (``make_model``) keep each test's inputs
explicit. Nothing here needs ``../shared``: tests make their own small data,
and ``shared_data`` skips a test when the shared corpus is absent.

The skip policy (:func:`glassllm_testing.need`): in CI a test that would skip for a
missing package fails instead, naming it; the two report hooks below apply that to
every ``pytest.importorskip`` too, at collection and while a test runs.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from glassllm.config import ModelConfig
from tests.support.glassllm_testing import CONFIGS, SHARED_DATA, TINY, TeachingTracer, randomize, strict_report  # noqa: F401


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    return strict_report((yield))


@pytest.hookimpl(wrapper=True)
def pytest_make_collect_report(collector):
    return strict_report((yield))


@pytest.fixture
def rng():
    return np.random.default_rng(1234)


@pytest.fixture
def make_model():
    """Factory: ``make_model(config=TINY, seed=0, dtype=np.float64)`` -> Transformer with random weights."""
    from glassllm.nn import Transformer

    def make(config: ModelConfig = TINY, seed: int = 0, dtype=np.float64):
        model = Transformer(config, seed=seed, dtype=dtype)
        return randomize(model, np.random.default_rng(seed + 1))
    return make


@pytest.fixture
def teaching_tracer():
    return TeachingTracer()


@pytest.fixture
def shared_data() -> Path:
    """The shared TinyStories folder (``../shared/data``); skips the test when it is absent."""
    if not SHARED_DATA.is_dir():
        pytest.skip(f"needs ../shared: the shared data folder {SHARED_DATA} is absent")
    return SHARED_DATA
