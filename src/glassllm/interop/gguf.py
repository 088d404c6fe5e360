"""Read a Llama from a GGUF file (what llama.cpp and its users share).

A GGUF file is a header of typed key/value metadata (the architecture, the
shape, the tokenizer's pieces, scores and types), a table of tensors (name,
shape, element type, offset), then the tensors' data. It is read here with
the ``gguf`` package, the reader llama.cpp's own project maintains.

What glassllm can hold
----------------------
- ``general.architecture`` = ``llama``, no experts, plain RoPE over whole heads
  (no ``rope.scaling`` type, a scaling factor of 1 or none, no ``rope_freqs``
  tensor), no biases; a head count or MLP width given per layer (a list, as
  llama.cpp allows) only if every layer's is the same;
- metadata of the types llama.cpp writes (an integer for a size, a number for
  ``layer_norm_rms_epsilon``, a list of strings for the tokens...): a value of
  another type is refused, naming its key;
- tensors in F32, F16, BF16, or Q8_0 (blocks of 32 int8 values and one float16
  scale, *dequantised* to float32: the model then computes with exactly the
  values ``gguf`` dequantises); every other quantisation is refused, naming the
  first tensor that uses it;
- a SentencePiece tokenizer (``tokenizer.ggml.model`` = ``llama``) with the
  pieces' scores and types; token ids that are sentinels such as 4294967295
  ("no padding token") are ignored.

Names, key for key (``{i}`` is the layer)::

    token_embd.weight           tok_embeddings.weight
    blk.{i}.attn_norm.weight    layers.{i}.attention_norm.weight
    blk.{i}.attn_q/k/v.weight   layers.{i}.attention.wq/wk/wv.weight
    blk.{i}.attn_output.weight  layers.{i}.attention.wo.weight
    blk.{i}.ffn_norm.weight     layers.{i}.ffn_norm.weight
    blk.{i}.ffn_gate.weight     layers.{i}.feed_forward.w1.weight
    blk.{i}.ffn_down.weight     layers.{i}.feed_forward.w2.weight
    blk.{i}.ffn_up.weight       layers.{i}.feed_forward.w3.weight
    output_norm.weight          norm.weight
    output.weight               output.weight (absent: a tied head, ModelConfig.tie_embeddings)

llama.cpp's converter stores the rows of ``attn_q`` and ``attn_k`` in Meta's
interleaved RoPE order, which is glassllm's own (see :mod:`glassllm.interop.hf`): they
are used as they are.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..checks import shown
from ..config import ModelConfig
from ..files import read_head
from ..limits import check_count, check_fits
from ..optional import require

__all__ = ["read_gguf", "GGUF_NAMES"]

MAGIC = b"GGUF"
_LAYER = {"attn_norm": "attention_norm", "attn_q": "attention.wq", "attn_k": "attention.wk",
          "attn_v": "attention.wv", "attn_output": "attention.wo", "ffn_norm": "ffn_norm",
          "ffn_gate": "feed_forward.w1", "ffn_down": "feed_forward.w2", "ffn_up": "feed_forward.w3"}
_TOKEN_TYPES = {1: "normal", 2: "unknown", 3: "control", 4: "user_defined", 5: "unused", 6: "byte"}
SUPPORTED = ("F32", "F16", "BF16", "Q8_0")


def GGUF_NAMES(n_layers: int) -> dict[str, str]:
    """GGUF tensor name -> glassllm parameter name."""
    names = {"token_embd.weight": "tok_embeddings.weight", "output_norm.weight": "norm.weight",
             "output.weight": "output.weight"}
    for i in range(n_layers):
        for theirs, ours in _LAYER.items():
            names[f"blk.{i}.{theirs}.weight"] = f"layers.{i}.{ours}.weight"
    return names


def _open(path: Path):
    gguf = require("gguf", "reading a GGUF file")

    head = read_head(path, 24)
    if head[:4] != MAGIC:
        raise ValueError(f"{str(path)!r} is not a GGUF file: it starts with {head[:4]!r}, expected {MAGIC!r}")
    check_counts(head, path.stat().st_size, str(path))
    try:
        reader = gguf.GGUFReader(str(path), "r")
    except Exception as e:                                      # gguf raises several kinds on a bad file
        raise ValueError(f"{str(path)!r} is truncated or damaged: {_one_line(e)}") from None
    size = path.stat().st_size
    for t in reader.tensors:
        if int(t.data_offset) + int(t.n_bytes) > size:
            raise ValueError(f"{str(path)!r} is truncated: tensor {t.name!r} ends at byte "
                             f"{int(t.data_offset) + int(t.n_bytes):,} but the file has {size:,}")
    return reader


# The fewest bytes one entry of a GGUF header can take: a metadata key (a length, one character, a type,
# a one-byte value) and a tensor's description (a name, one dimension, a type and an offset).
_MIN_KV_BYTES, _MIN_TENSOR_BYTES = 8 + 1 + 4 + 1, 8 + 1 + 4 + 8 + 4 + 8
_MIN_BYTES_PER_WEIGHT = 34 / 32                                  # Q8_0, the smallest type glassllm reads


def check_counts(head: bytes, size: int, where: str) -> None:
    """The counts a GGUF header opens with (version, tensors, metadata keys), bounded by
    :mod:`glassllm.limits` and by the file's ``size`` before any reader loops over them."""
    if len(head) < 24:
        raise ValueError(f"{where!r} is truncated: {len(head)} bytes, less than a GGUF header (24)")
    order = "little" if int.from_bytes(head[4:8], "little") & 0xFFFF else "big"     # as gguf's reader decides
    version = int.from_bytes(head[4:8], order)
    n_tensors, n_kv = int.from_bytes(head[8:16], order), int.from_bytes(head[16:24], order)
    if version not in (2, 3):
        raise ValueError(f"{where!r}: GGUF version {version} is not supported; expected 2 or 3")
    check_count("tensor_count", n_tensors, "tensors", repr(where))
    check_count("metadata_kv_count", n_kv, "metadata", repr(where))
    check_fits(24 + n_kv * _MIN_KV_BYTES + n_tensors * _MIN_TENSOR_BYTES, size,
               f"its {n_kv:,} metadata keys and {n_tensors:,} tensor descriptions", repr(where))


def _one_line(e: Exception) -> str:
    return " ".join(str(e).split()) or type(e).__name__


_KINDS = {bool: "true or false", int: "an integer", float: "a number", str: "a string", list: "a list"}
_PLURALS = {int: "integers", float: "numbers", str: "strings"}


def _kind_of(value) -> str:
    return _KINDS.get(type(value), type(value).__name__)


def _is(value, kind) -> bool:
    """Whether the metadata ``value`` is of ``kind``: an integer is a number too, true or false is neither."""
    if isinstance(value, bool):
        return kind is bool
    return isinstance(value, (int, float) if kind is float else kind)


def read_gguf(path):
    """``(config, state, tokenizer)`` of a Llama GGUF file; ``ValueError`` naming what cannot be held."""
    gguf = require("gguf", "reading a GGUF file")

    from ..tokenizers.sentencepiece import SPTokenizer

    path = Path(path)
    where = str(path)
    reader = _open(path)

    def get(key, default=None, kind=None, layers=None):
        """Metadata ``key`` (``default`` if absent), of type ``kind`` if given; with ``layers``, a list of
        one value per layer (as llama.cpp allows) is that value, if every layer's is the same."""
        field = reader.fields.get(key)
        if field is None:
            return default
        try:
            value = field.contents()
        except Exception as e:
            raise ValueError(f"{where}: metadata {key!r} cannot be read ({_one_line(e)})") from None
        if kind is None:
            return value
        if layers is not None and isinstance(value, list) and value and all(_is(v, kind) for v in value):
            if len(value) != layers:
                raise ValueError(f"{where}: {key}={shown(value, 60)} has {len(value)} entries; expected one per "
                                 f"layer (llama.block_count={layers})")
            if any(v != value[0] for v in value):
                raise ValueError(f"{where}: {key}={shown(value, 60)} differs between layers; expected the same "
                                 "value for every layer (glassllm's layers are all alike)")
            value = value[0]
        if not _is(value, kind):
            per_layer = " (or a list of one per layer)" if layers is not None else ""
            raise ValueError(f"{where}: {key}={shown(value, 60)} is {_kind_of(value)}; expected {_KINDS[kind]}"
                             f"{per_layer}")
        return float(value) if kind is float else value

    def get_list(key, kind):
        """The list metadata ``key`` (None if absent), each item of type ``kind``."""
        value = get(key)
        if value is None:
            return None
        bad = next((v for v in value if not _is(v, kind)), None) if isinstance(value, list) else value
        if bad is not None:
            held = f"is {_kind_of(value)}" if bad is value else f"holds {_kind_of(bad)} ({shown(bad, 20)})"
            raise ValueError(f"{where}: {key}={shown(value, 60)} {held}; expected a list of {_PLURALS[kind]}")
        return value

    arch = get("general.architecture")
    if arch != "llama":
        raise ValueError(f"{where}: general.architecture={arch!r} is not supported; expected 'llama'")
    experts = get("llama.expert_count", 0, int)
    if experts:
        raise ValueError(f"{where}: llama.expert_count={experts} is not supported; expected no experts (a dense Llama)")
    scaling = get("llama.rope.scaling.type")
    if scaling not in (None, "none"):
        raise ValueError(f"{where}: llama.rope.scaling.type={scaling!r} is not supported; expected none (plain RoPE)")
    for key in ("llama.rope.scaling.factor", "llama.rope.scale_linear"):     # llama.cpp reads either
        factor = get(key, kind=float)
        if factor not in (None, 0.0, 1.0):
            raise ValueError(f"{where}: {key}={factor} scales RoPE, which is not supported; expected no factor, "
                             "0 or 1 (glassllm computes plain RoPE)")
    for key in ("llama.embedding_length", "llama.block_count", "llama.feed_forward_length",
                "llama.attention.head_count"):
        if get(key) is None:
            raise ValueError(f"{where} has no {key!r}; expected a Llama GGUF")
    n_layers = get("llama.block_count", kind=int)
    dim, heads = get("llama.embedding_length", kind=int), get("llama.attention.head_count", kind=int, layers=n_layers)
    rope_dims = get("llama.rope.dimension_count", kind=int)
    if rope_dims is not None and heads and rope_dims * heads != dim:
        raise ValueError(f"{where}: llama.rope.dimension_count={rope_dims} is not supported; expected the whole "
                         f"head, {dim}/{heads}")
    key_len = get("llama.attention.key_length", kind=int)
    if key_len is not None and heads and key_len * heads != dim:
        raise ValueError(f"{where}: llama.attention.key_length={key_len} is not supported; expected {dim}/{heads}")

    # The tokenizer.
    tok_model = get("tokenizer.ggml.model")
    if tok_model != "llama":
        raise ValueError(f"{where}: tokenizer.ggml.model={tok_model!r} is not supported; expected 'llama' "
                         "(SentencePiece BPE)")
    if get("tokenizer.ggml.remove_extra_whitespaces", False, bool):
        raise ValueError(f"{where}: tokenizer.ggml.remove_extra_whitespaces=true is not supported; expected false")
    tokens = get_list("tokenizer.ggml.tokens", str)
    if not tokens:
        raise ValueError(f"{where} has no tokenizer.ggml.tokens; expected the vocabulary")
    V = len(tokens)
    check_count("tokenizer.ggml.tokens", V, "vocabulary", where)
    scores = get_list("tokenizer.ggml.scores", float) or [0.0] * V
    types = get_list("tokenizer.ggml.token_type", int) or [1] * V
    if len(scores) != V or len(types) != V:
        raise ValueError(f"{where}: {V} tokens but {len(scores)} scores and {len(types)} token types; "
                         "expected one of each per token")
    if any(t not in _TOKEN_TYPES for t in types):
        bad = next(t for t in types if t not in _TOKEN_TYPES)
        raise ValueError(f"{where}: token type {bad} is not a SentencePiece type (1..6)")
    pieces = [(p, float(s), _TOKEN_TYPES[int(t)]) for p, s, t in zip(tokens, scores, types)]
    for key, name in (("tokenizer.ggml.bos_token_id", "<s>"), ("tokenizer.ggml.eos_token_id", "</s>"),
                      ("tokenizer.ggml.unknown_token_id", "<unk>")):
        i = get(key, kind=int)
        if i is None or not 0 <= i < V:                         # absent, or a sentinel such as 4294967295
            continue
        if tokens[i] != name:
            raise ValueError(f"{where}: {key}={i} is {tokens[i]!r}; expected the piece {name!r}")
    add_bos = get("tokenizer.ggml.add_bos_token", True, bool)
    if get("tokenizer.ggml.add_eos_token", False, bool):
        raise ValueError(f"{where}: tokenizer.ggml.add_eos_token=true is not supported; expected false")
    try:
        tokenizer = SPTokenizer(pieces, add_bos=add_bos,
                                add_dummy_prefix=get("tokenizer.ggml.add_space_prefix", True, bool),
                                byte_fallback=any(t == 6 for t in types))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: tokenizer: {e}") from None

    tied = not any(t.name == "output.weight" for t in reader.tensors)   # the head is the embedding
    sizes = dict(vocab_size=get("llama.vocab_size", V, int), dim=dim, n_layers=n_layers, n_heads=heads,
                 n_kv_heads=get("llama.attention.head_count_kv", heads, int, n_layers),
                 ffn_dim=get("llama.feed_forward_length", kind=int, layers=n_layers),
                 max_seq_len=get("llama.context_length", 2048, int),
                 norm_eps=get("llama.attention.layer_norm_rms_epsilon", 1e-5, float),
                 rope_theta=get("llama.rope.freq_base", 10000.0, float))
    try:
        config = ModelConfig(**sizes, tie_embeddings=tied)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None
    if config.vocab_size != V:
        raise ValueError(f"{where}: llama.vocab_size={config.vocab_size} but the tokenizer has {V} tokens; "
                         "expected them equal")

    # The tensors: names and types first, then whether the file can hold them, then their data.
    names = GGUF_NAMES(config.n_layers)
    for t in reader.tensors:
        if t.name not in names:
            hint = (" (glassllm has no biases)" if t.name.endswith(".bias") else
                    " (RoPE scaling)" if t.name.startswith("rope_freqs") else "")
            raise ValueError(f"{where}: unexpected tensor {t.name!r}{hint}; expected only Llama weights")
        kind = t.tensor_type.name
        if kind not in SUPPORTED:
            raise ValueError(f"{where}: tensor {t.name!r} is {kind}; expected one of {', '.join(SUPPORTED)} "
                             "(other quantisations are not supported)")
    config.check_weights_fit(path.stat().st_size, _MIN_BYTES_PER_WEIGHT, where)
    config.check_tables(path.stat().st_size, where)
    state = {}
    for t in reader.tensors:
        try:
            w = gguf.quants.dequantize(t.data, t.tensor_type)
        except Exception as e:
            raise ValueError(f"{where}: tensor {t.name!r} cannot be read ({_one_line(e)})") from None
        shape = tuple(int(n) for n in reversed(t.shape))                        # GGML lists the inner size first
        state[names[t.name]] = np.asarray(w, dtype=np.float32).reshape(shape)  # (out, in) or (C,)
    return config, state, tokenizer
