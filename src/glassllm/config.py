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
- ``tie_embeddings = False``: the output head is a matrix of its own, as in LLaMA.
  With True the head reads the embedding matrix (Hugging Face's
  ``tie_word_embeddings``: SmolLM2 and many small Llamas), one parameter used twice,
  and a model file holds no ``output.weight``.
"""

from __future__ import annotations

import dataclasses
import json
import math
from dataclasses import dataclass

from .checks import ParameterError, ParameterTypeError, check_int
from .limits import over_limit, parse_json

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
        d = parse_json(s, cls.KIND)
        return cls.from_dict(d)


MAX_TABLE_BYTES = 64 << 20   # position tables any model file may ask for (ModelConfig.check_tables)

# Each size's entry in glassllm.limits.LIMITS (vocab_size has its own bound below: uint16 ids).
_LIMIT_OF = {"dim": "width", "n_layers": "layers", "n_heads": "heads", "n_kv_heads": "heads", "ffn_dim": "ffn",
             "max_seq_len": "context"}


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
    tie_embeddings: bool = False

    def __post_init__(self):
        for name in ("vocab_size", "dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "max_seq_len"):
            value = check_int(name, getattr(self, name), low=1, owner="ModelConfig")
            object.__setattr__(self, name, value)           # a NumPy integer is kept as the int it is
            problem = name != "vocab_size" and over_limit(value, _LIMIT_OF[name])
            if problem:                                     # glassllm.limits: checked before anything is built
                raise ParameterError(name, problem, owner="ModelConfig")
        for name in ("norm_eps", "rope_theta"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float)) or not _finite(value) or value <= 0:
                shown = f"an int of {len(str(value))} digits" if isinstance(value, int) and value > 1e300 else repr(value)
                raise ParameterError(name, f"must be a finite number > 0, got {shown:.60}", owner="ModelConfig")
        if not isinstance(self.tie_embeddings, bool):
            raise ParameterTypeError("tie_embeddings", f"must be true or false, got {self.tie_embeddings!r:.60}",
                                     owner="ModelConfig")
        if self.dim % self.n_heads:
            raise ParameterError("dim", f"={self.dim} is not divisible by n_heads={self.n_heads}", owner="ModelConfig")
        if self.n_heads % self.n_kv_heads:
            raise ParameterError("n_heads", f"={self.n_heads} is not divisible by n_kv_heads={self.n_kv_heads}",
                                 owner="ModelConfig")
        if self.head_dim % 2:
            raise ValueError(f"head size dim/n_heads={self.head_dim} must be even for RoPE pairs")
        if self.vocab_size > 65536:
            raise ParameterError("vocab_size", f"={self.vocab_size} exceeds 65536 (token ids are stored as uint16)",
                                 owner="ModelConfig")

    def to_dict(self) -> dict:
        """The fields as a dict; ``tie_embeddings`` only when True, so that an untied model's config
        reads as it always has (in model files, trace files and the inspector's cache keys)."""
        d = super().to_dict()
        if not self.tie_embeddings:
            del d["tie_embeddings"]
        return d

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def n_rep(self) -> int:
        """How many query heads share one key/value head."""
        return self.n_heads // self.n_kv_heads

    @property
    def n_params(self) -> int:
        """How many numbers the parameters hold, by arithmetic (nothing is built); a tied head
        counts once, inside the embedding.

        >>> ModelConfig().n_params == sum(math.prod(s) for s in ModelConfig().param_shapes().values())
        True
        """
        C, F, D = self.dim, self.ffn_dim, self.head_dim
        per_layer = 2 * C + self.n_heads * D * C * 2 + 2 * self.n_kv_heads * D * C + 3 * F * C
        vocab_matrices = 1 if self.tie_embeddings else 2           # the embedding, and the head unless tied
        return vocab_matrices * self.vocab_size * C + C + self.n_layers * per_layer

    @property
    def table_bytes(self) -> int:
        """Bytes of the rotary position tables a model of this config builds: cos and sin, float64 and a
        float32 copy, for every position (they cost nothing in a file, so readers weigh them against it)."""
        return self.max_seq_len * (self.head_dim // 2) * 2 * (8 + 4)

    def check_tables(self, file_bytes: int, where: str) -> None:
        """Refuse a config whose position tables would dwarf the weights its file holds.

        The rotary tables (and a KV cache) grow with ``max_seq_len``, which costs no bytes in a
        file: a crafted config could ask for millions of positions for a model of a few KB. Their
        size (:attr:`table_bytes`) may not exceed the file's ``file_bytes`` or 64 MiB, whichever is
        larger; a ``ValueError`` line naming ``where`` otherwise.
        """
        budget = max(file_bytes, MAX_TABLE_BYTES)
        if self.table_bytes > budget:
            per = self.table_bytes // self.max_seq_len
            raise ValueError(f"{where!r}: max_seq_len={self.max_seq_len} needs {self.table_bytes / 2**20:.0f} MiB of "
                             f"position tables, more than this file's weights justify (at most {budget // per} positions)")

    def check_weights_fit(self, file_bytes: int, bytes_per_value: float, where: str) -> None:
        """Refuse a file of ``file_bytes`` that cannot hold this config's :attr:`n_params` values of at
        least ``bytes_per_value`` bytes each (a tied head is stored once, as the embedding)."""
        need = math.ceil(self.n_params * bytes_per_value)
        if need > file_bytes:
            raise ValueError(f"{where!r}: its config (dim={self.dim}, n_layers={self.n_layers}, vocab_size="
                             f"{self.vocab_size}, ffn_dim={self.ffn_dim}) needs {self.n_params:,} weights, at least "
                             f"{need:,} bytes, but the file holds {file_bytes:,}; expected a complete checkpoint")

    def param_shapes(self) -> dict[str, tuple[int, ...]]:
        """Every parameter's name (LLaMA's, as :mod:`glassllm.nn` names them) and shape, from
        the config alone: no weights are allocated. Loaders check a file against it before
        reading any tensor data. A tied head has no entry: it is ``tok_embeddings.weight``.

        >>> shapes = ModelConfig().param_shapes()
        >>> shapes["layers.0.attention.wk.weight"], len(shapes)
        ((64, 128), 39)
        >>> "output.weight" in ModelConfig(tie_embeddings=True).param_shapes()
        False
        """
        H, G, D, C, F, V = self.n_heads, self.n_kv_heads, self.head_dim, self.dim, self.ffn_dim, self.vocab_size
        shapes = {"tok_embeddings.weight": (V, C), "norm.weight": (C,)}
        if not self.tie_embeddings:
            shapes["output.weight"] = (V, C)
        per_layer = {"attention_norm.weight": (C,), "attention.wq.weight": (H * D, C),
                     "attention.wk.weight": (G * D, C), "attention.wv.weight": (G * D, C),
                     "attention.wo.weight": (C, H * D), "ffn_norm.weight": (C,),
                     "feed_forward.w1.weight": (F, C), "feed_forward.w2.weight": (C, F),
                     "feed_forward.w3.weight": (F, C)}
        for i in range(self.n_layers):
            shapes.update({f"layers.{i}.{k}": v for k, v in per_layer.items()})
        return shapes

    @staticmethod
    def llama_ffn_dim(dim: int, multiple_of: int = 32) -> int:
        """LLaMA's SwiGLU width rule: 8/3 x dim, rounded up to ``multiple_of``."""
        return _llama_ffn_dim(dim, multiple_of)
