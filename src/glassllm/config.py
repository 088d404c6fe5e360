"""The model's shape, as a frozen and validated dataclass.

The defaults are the bundled model the lessons describe: a vocabulary of 1,024
tokens, width C = 128, 4 layers, H = 4 query heads sharing G = 2 key/value
heads of size D = 32, and no biases anywhere.

Choices made here (documented because the spec leaves them open):

- ``max_seq_len = 512``. TinyStories stories are mostly 100--300 tokens with our
  tokenizer, so 256 positions see whole stories; 512 leaves room for a
  16-token prompt plus 256 new tokens (the decoding benchmark) and for the
  inspector to step far past a prompt. RoPE has no learned positions, so the
  context is a limit of the KV cache, not of a table of weights.
- ``ffn_dim = 352``: LLaMA's rule, 8/3 x C rounded up to a multiple of
  ``multiple_of`` -- 32 here, for a width of 128 (Meta's code uses 256, which
  would give 512). Three matrices of 8/3 C keep the parameter count of a
  4 x C two-matrix MLP.
- ``norm_eps = 1e-5`` (LLaMA 2), ``rope_theta = 10000`` (the RoPE paper).
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

__all__ = ["JsonConfig", "ModelConfig"]


def _llama_ffn_dim(dim: int, multiple_of: int = 32) -> int:
    hidden = int(2 * 4 * dim / 3)
    return multiple_of * math.ceil(hidden / multiple_of)


def _finite(x) -> bool:
    """Is the number ``x`` a finite float? (An int too large for a float is not.)"""
    try:
        return math.isfinite(x)
    except OverflowError:
        return False


class JsonConfig:
    """``to_dict``/``to_json`` and strict ``from_dict``/``from_json`` for a frozen config dataclass.

    ``from_dict`` refuses unknown keys (naming them) and lets ``__post_init__``
    validate every value. ``KIND`` names the config in error messages.
    """

    KIND = "config"

    def to_dict(self) -> dict:
        return dataclasses.asdict(self)

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    @classmethod
    def from_dict(cls, d: dict):
        if not isinstance(d, dict):
            raise TypeError(f"{cls.KIND} must be a dict, got {type(d).__name__}")
        known = {f.name for f in dataclasses.fields(cls)}
        unknown = sorted(set(d) - known)
        if unknown:
            raise ValueError(f"unknown {cls.KIND} key(s) {unknown}; expected some of {sorted(known)}")
        return cls(**d)

    @classmethod
    def from_json(cls, s: str):
        try:
            d = json.loads(s)
        except json.JSONDecodeError as e:
            raise ValueError(f"{cls.KIND} is not valid JSON: {e}") from None
        except RecursionError:
            raise ValueError(f"{cls.KIND} is not valid JSON: nested too deeply") from None
        return cls.from_dict(d)


@dataclass(frozen=True)
class ModelConfig(JsonConfig):
    """Hyperparameters of a glassllm decoder.

    >>> ModelConfig().head_dim, ModelConfig().ffn_dim
    (32, 352)
    """

    KIND = "model config"

    vocab_size: int = 1024
    dim: int = 128
    n_layers: int = 4
    n_heads: int = 4
    n_kv_heads: int = 2
    ffn_dim: int = 352
    max_seq_len: int = 512
    norm_eps: float = 1e-5
    rope_theta: float = 10000.0

    def __post_init__(self):
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "max_seq_len"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise TypeError(f"ModelConfig.{name} must be an int, got {value!r}")
            if value < 1:
                raise ValueError(f"ModelConfig.{name} must be >= 1, got {value}")
        for name in ("norm_eps", "rope_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value) or value <= 0:
                shown = f"an int of {len(str(value))} digits" if isinstance(value, int) and value > 1e300 else repr(value)
                raise ValueError(f"ModelConfig.{name} must be a finite number > 0, got {shown:.60}")
        if self.dim % self.n_heads:
            raise ValueError(f"ModelConfig.dim={self.dim} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"ModelConfig.n_heads={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"head size dim/n_heads={self.head_dim} must be even for RoPE pairs")
        if self.vocab_size > 65536:
            raise ValueError(f"ModelConfig.vocab_size={self.vocab_size} exceeds 65536 (token ids are stored as uint16)")

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def n_rep(self) -> int:
        """How many query heads share one key/value head."""
        return self.n_heads // self.n_kv_heads

    @staticmethod
    def llama_ffn_dim(dim: int, multiple_of: int = 32) -> int:
        """LLaMA's SwiGLU width rule: 8/3 x dim, rounded up to ``multiple_of``."""
        return _llama_ffn_dim(dim, multiple_of)
