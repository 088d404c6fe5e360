"""Helpers shared by the tests and benchmarks: model configs of several shapes,
seeded trained-scale weights, a teaching-path tracer, and the skip policy for
optional packages (:func:`need`).

This is an ordinary module (``from tests.support.glassllm_testing import ...``) rather than
``conftest.py``, whose module name pytest shares with other conftest files
(docs/lessons has one). Fixtures live in tests/conftest.py.
"""

from __future__ import annotations

import importlib
import os
import re
from pathlib import Path

import numpy as np
from glassllm.config import ModelConfig
from glassllm.optional import EXTRAS

# Model shapes the comparisons run over. "default" is the bundled model's shape;
# the others change every width, the head count and the grouping (GQA with 3
# query heads per K/V head, multi-query with one K/V head, plain multi-head).
CONFIGS = {
    "default": ModelConfig(),
    "gqa3": ModelConfig(vocab_size=97, dim=96, n_layers=3, n_heads=6, n_kv_heads=2, ffn_dim=200,
                        max_seq_len=64, norm_eps=1e-6, rope_theta=500.0),
    "mqa": ModelConfig(vocab_size=61, dim=40, n_layers=2, n_heads=5, n_kv_heads=1, ffn_dim=72,
                       max_seq_len=32),
    "mha": ModelConfig(vocab_size=50, dim=48, n_layers=2, n_heads=3, n_kv_heads=3, ffn_dim=128,
                       max_seq_len=32, rope_theta=100.0),
}

# A small config for tests that need a model but not a particular shape.
TINY = ModelConfig(vocab_size=53, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=24)

ROOT = Path(__file__).resolve().parents[2]
SHARED_DATA = ROOT.parent / "shared" / "data"


# -- the skip policy ------------------------------------------------------------------------------
# A test that needs an optional package skips without it on a developer's machine. In CI (CI=true, or
# GLASSLLM_STRICT=1, which .ci/run sets) such a skip is a failure naming the package: CI installs
# .[dev] into a fresh environment, so a missing package there is a missing declaration. Skips for
# other reasons (../shared absent, no browser, no GPU) stay skips, and say so in their reason.
STRICT_ENV = "GLASSLLM_STRICT"
IMPORT_SKIP = re.compile(r"could not import '(?P<module>[\w.]+)'(?:: No module named '(?P<missing>[\w.]+)')?")


def strict() -> bool:
    """Is a skip for a missing package a failure here? ``GLASSLLM_STRICT=1``/``0`` decides; unset, ``CI=true``."""
    value = os.environ.get(STRICT_ENV)
    if value is not None:
        return value.strip() == "1"
    return os.environ.get("CI", "").strip().lower() == "true"


def _requirement_name(req: str) -> str:
    return re.split(r"[<>=!~\[; ]", req, maxsplit=1)[0].strip().lower().replace("_", "-")


def extra_requirements(extra: str) -> set[str] | None:
    """The distributions ``.[extra]`` brings, following the extras it names (``glassllm-numpy[app]``), with
    the core dependencies; names normalised (``transformer-lens``). None without ``tomllib`` (Python 3.10)."""
    try:
        import tomllib
    except ModuleNotFoundError:
        return None
    project = tomllib.loads((ROOT / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    extras, own = project.get("optional-dependencies", {}), project["name"]

    def closure(name: str) -> set[str]:
        out = set()
        for req in extras[name]:
            inner = re.fullmatch(rf"{re.escape(own)}\[([\w,-]+)\]", req.strip())
            if inner:
                for sub in inner.group(1).split(","):
                    out |= closure(sub)
            else:
                out.add(_requirement_name(req))
        return out
    return closure(extra) | {_requirement_name(r) for r in project.get("dependencies", [])}


def dev_packages() -> set[str] | None:
    """The distributions ``.[dev]`` brings (see :func:`extra_requirements`)."""
    return extra_requirements("dev")


def package_of(module: str) -> str:
    """The distribution that provides the top-level module of ``module`` (``transformer_lens`` -> ``transformer-lens``)."""
    top = module.split(".")[0]
    return EXTRAS[top][0] if top in EXTRAS else top.replace("_", "-")


def missing_message(module: str) -> str:
    """Why a test cannot run without ``module``, naming the package and what to do about it."""
    package = package_of(module)
    dev = dev_packages()
    if dev is not None and package.lower() not in dev:
        return (f"{package} is not installed, and .[dev] does not declare it: the tests need it, so add it to "
                f"[dev] in pyproject.toml")
    return f'{package} is not installed: the tests need it, and .[dev] brings it (pip install -e ".[dev]")'


def need(module: str):
    """Import and return ``module`` for a test, or skip the test (a failure under :func:`strict`).

    The project's ``pytest.importorskip``: call it inside the test (or a fixture), never at module level,
    so that a test skips only for what it needs itself.
    """
    import pytest                                      # (the benchmarks import this module without pytest)

    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as e:
        missing = e.name or module
    if strict():
        pytest.fail(missing_message(missing), pytrace=False)
    pytest.skip(missing_message(missing))


def strict_report(report):
    """Under :func:`strict`, turn a skip that ``pytest.importorskip`` made into a failure naming the package.

    Used by tests/conftest.py's report hooks, for any import skip that did not come through :func:`need`.
    """
    if not (report.skipped and strict() and isinstance(report.longrepr, tuple)):
        return report
    found = IMPORT_SKIP.search(str(report.longrepr[2]))
    if found:
        report.outcome = "failed"
        report.longrepr = missing_message(found.group("missing") or found.group("module"))
    return report


def story_text(stories) -> str:
    """Stories in the shared story files' layout: each followed by a line ``<|endoftext|>``."""
    return "".join(s + "\n<|endoftext|>\n" for s in stories)


def story_files(folder, train: str, valid: str, names=("train.txt", "valid.txt")) -> tuple[Path, Path]:
    """A training and a held-out story file written in ``folder``: their paths."""
    paths = Path(folder) / names[0], Path(folder) / names[1]
    for path, text in zip(paths, (train, valid)):
        path.write_text(text, encoding="utf-8")
    return paths


def randomize(model, rng: np.random.Generator):
    """Give ``model`` weights of a trained-like scale, drawn from ``rng``; returns the model.

    A fresh model (std 0.02) gives near-uniform attention and logits near zero,
    which would let a wrong mask or rotation hide. Here matrices get std
    1/sqrt(fan_in) (embeddings std 1) and norm gains 1 +- 0.2, so every
    attention row is peaked differently and logits spread over several units.
    """
    state = {}
    for name, p in model.named_parameters():
        if name.endswith("norm.weight"):
            value = 1.0 + 0.2 * rng.standard_normal(p.shape)
        elif name == "tok_embeddings.weight":
            value = rng.standard_normal(p.shape)
        else:
            value = rng.standard_normal(p.shape) / np.sqrt(p.shape[1])
        state[name] = value
    model.load_state_dict(state)
    return model


class TeachingTracer:
    """The smallest tracer: wants every snapshot and changes nothing.

    Attaching it forces every layer onto its reference ``__call__`` (no kernel
    runs: scores, mask and softmax as separate tensors; RMSNorm spelled out),
    which must compute the same numbers as the kernels. ``seen`` lists the names recorded and
    ``values`` keeps a copy of each one's latest array (batch axis included).
    """

    def __init__(self):
        self.seen: list[str] = []
        self.values: dict[str, np.ndarray] = {}
        self.forwards: list[dict] = []

    def begin_forward(self, **info):
        self.forwards.append(info)

    def wants(self, names) -> bool:
        return True

    def record(self, name, t):
        self.seen.append(name)
        self.values[name] = np.array(t.data)
        return t
