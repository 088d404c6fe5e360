"""Helpers shared by the tests and benchmarks: model configs of several shapes,
seeded trained-scale weights, and a teaching-path tracer.

This is an ordinary module (``from glassllm_testing import ...``) rather than
``conftest.py``, whose module name pytest shares with other conftest files
(docs/lessons has one). Fixtures live in tests/conftest.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
from glassllm.config import ModelConfig

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

SHARED_DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data"


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
