"""Read a llama2.c checkpoint (``model.bin``) and its ``tokenizer.bin``.

llama2.c (Karpathy's Llama 2 in one C file) writes float32 weights after a
small header, in the layouts of its ``export.py``. Both are read here:

**Legacy** (``run.c``'s own format, e.g. ``stories15M.bin``): a header of 7
int32 -- ``dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size,
seq_len`` -- where a *negative* ``vocab_size`` means the output head is stored
separately (positive: tied to the embedding). Then, each over all layers::

    token_embedding (V, C)
    attention_norm  (L, C)      wq (L, C, C)   wk (L, G*D, C)   wv (L, G*D, C)   wo (L, C, C)
    ffn_norm        (L, C)      w1 (L, F, C)   w2 (L, C, F)     w3 (L, F, C)
    final norm      (C,)
    freq_cis_real   (seq_len, D/2)   freq_cis_imag (seq_len, D/2)   (RoPE tables: skipped)
    output          (V, C)      only if not tied

**Version 1** (``export.py --version 1``): a 256-byte header -- the magic
``0x616b3432`` ("ak42"), version 1, the same 7 int32, one byte "shared
classifier", zeros -- then::

    attention_norm (L, C)  ffn_norm (L, C)  final norm (C,)  token_embedding (V, C)
    wq  wk  wv  wo  w1  w2  w3  (each over all layers)   output (V, C) if not shared

Version 2 (int8 groups) is refused. Matrices are PyTorch ``Linear`` weights
(out, in), in Meta's interleaved RoPE order, which is glassllm's: they load
as they are. llama2.c fixes RoPE's base at 10,000 and RMSNorm's epsilon at
1e-5, and the file holds nothing else, so nothing else can differ. A shared
classifier (a tied head) is imported tied (``ModelConfig.tie_embeddings``): the
model file holds the embedding once.

``tokenizer.bin``: an int32 ``max_token_length``, then per id a float32
score, an int32 length and that many bytes of the piece, with ``▁`` written
as a space and ``<s>``/``</s>`` as ``"\\n<s>\\n"``/``"\\n</s>\\n"``. Ids 0, 1, 2
are ``<unk> <s> </s>``; ``<0xNN>`` pieces are the byte fallback.
"""

from __future__ import annotations

import struct
from pathlib import Path

import numpy as np

from ..config import ModelConfig
from ..files import read_file
from ..limits import check_count

__all__ = ["read_llama2c", "read_llama2c_tokenizer", "MAGIC"]

MAGIC = 0x616B3432
_HEADER_KEYS = ("dim", "hidden_dim", "n_layers", "n_heads", "n_kv_heads", "vocab_size", "seq_len")
# Each header number's entry in glassllm.limits.LIMITS.
_LIMIT_OF = {"dim": "width", "hidden_dim": "ffn", "n_layers": "layers", "n_heads": "heads", "n_kv_heads": "heads",
             "vocab_size": "vocabulary", "seq_len": "context"}


def _header(data: memoryview, where: str) -> tuple[dict, int, bool, int]:
    """``(params, version, shared_classifier, offset of the weights)``."""
    if len(data) < 28:
        raise ValueError(f"{where} is {len(data)} bytes, too short for a llama2.c header (28 bytes or more)")
    magic, = struct.unpack_from("<I", data, 0)
    if magic == MAGIC:
        version, = struct.unpack_from("<i", data, 4)
        if version != 1:
            raise ValueError(f"{where}: llama2.c export version {version} is not supported; expected the legacy "
                             "format or version 1 (float32)")
        if len(data) < 256:
            raise ValueError(f"{where} is truncated: a version 1 header is 256 bytes, the file has {len(data)}")
        params = dict(zip(_HEADER_KEYS, struct.unpack_from("<7i", data, 8)))
        shared = bool(data[36])
        return params, 1, shared, 256
    params = dict(zip(_HEADER_KEYS, struct.unpack_from("<7i", data, 0)))
    shared = params["vocab_size"] > 0
    params["vocab_size"] = abs(params["vocab_size"])
    return params, 0, shared, 28


def read_llama2c(path, tokenizer_path=None):
    """``(config, state, tokenizer)`` of a llama2.c ``.bin``; ``tokenizer.bin`` is looked for beside it."""
    path = Path(path)
    where = str(path)
    data = memoryview(read_file(path))
    p, version, shared, offset = _header(data, where)
    for key, value in p.items():
        if value <= 0:
            raise ValueError(f"{where}: header says {key}={value}, which is not a llama2.c model; "
                             "expected a positive size (is this a llama2.c .bin?)")
        check_count(key, value, _LIMIT_OF[key], where)
    C, F, L, H, G, V, T = (p[k] for k in _HEADER_KEYS)
    if C % H or H % G:
        raise ValueError(f"{where}: header says dim={C}, n_heads={H}, n_kv_heads={G}; expected dim divisible by "
                         "n_heads, and n_heads by n_kv_heads")
    try:                                        # every size against glassllm.limits, before anything is built
        config = ModelConfig(vocab_size=V, dim=C, n_layers=L, n_heads=H, n_kv_heads=G, ffn_dim=F, max_seq_len=T,
                             norm_eps=1e-5, rope_theta=10000.0, tie_embeddings=shared)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None
    D = C // H
    # The file's size, by arithmetic: the weights (the output head unless tied) and the RoPE tables.
    need = offset + 4 * (config.n_params + (T * (D // 2) * 2 if version == 0 else 0))
    if need != len(data):
        layout = "legacy" if version == 0 else "version 1"
        raise ValueError(f"{where} is {len(data):,} bytes but its {layout} header (dim={C}, hidden_dim={F}, "
                         f"n_layers={L}, n_heads={H}, n_kv_heads={G}, vocab_size={V}, seq_len={T}, "
                         f"{'tied' if shared else 'separate'} output) needs {need:,}; expected them equal "
                         "(a truncated file, or not a llama2.c float32 export)")
    shapes = {"tok_embeddings.weight": (V, C)}
    per_layer = {"attention_norm.weight": (C,), "attention.wq.weight": (C, C), "attention.wk.weight": (G * D, C),
                 "attention.wv.weight": (G * D, C), "attention.wo.weight": (C, C), "ffn_norm.weight": (C,),
                 "feed_forward.w1.weight": (F, C), "feed_forward.w2.weight": (C, F), "feed_forward.w3.weight": (F, C)}
    L_ = lambda name: [f"layers.{i}.{name}" for i in range(L)]  # noqa: E731
    if version == 0:
        order = ["tok_embeddings.weight", *L_("attention_norm.weight"), *L_("attention.wq.weight"),
                 *L_("attention.wk.weight"), *L_("attention.wv.weight"), *L_("attention.wo.weight"),
                 *L_("ffn_norm.weight"), *L_("feed_forward.w1.weight"), *L_("feed_forward.w2.weight"),
                 *L_("feed_forward.w3.weight"), "norm.weight", "freq_cis_real", "freq_cis_imag"]
    else:
        order = [*L_("attention_norm.weight"), *L_("ffn_norm.weight"), "norm.weight", "tok_embeddings.weight",
                 *L_("attention.wq.weight"), *L_("attention.wk.weight"), *L_("attention.wv.weight"),
                 *L_("attention.wo.weight"), *L_("feed_forward.w1.weight"), *L_("feed_forward.w2.weight"),
                 *L_("feed_forward.w3.weight")]
    if not shared:
        order.append("output.weight")
    shapes.update({"norm.weight": (C,), "output.weight": (V, C), "freq_cis_real": (T, D // 2),
                   "freq_cis_imag": (T, D // 2)})
    for i in range(L):
        shapes.update({f"layers.{i}.{k}": s for k, s in per_layer.items()})
    state = {}
    for key in order:
        n = int(np.prod(shapes[key]))
        w = np.frombuffer(data, dtype="<f4", count=n, offset=offset).reshape(shapes[key])  # (out, in)
        offset += 4 * n
        if not key.startswith("freq_cis"):
            state[key] = w.astype(np.float32)
    tok_path = Path(tokenizer_path) if tokenizer_path is not None else path.with_name("tokenizer.bin")
    if not tok_path.is_file():
        raise ValueError(f"{where}: no tokenizer {str(tok_path)!r}; expected llama2.c's tokenizer.bin beside the "
                         "model (or name it with --tokenizer)")
    tokenizer = read_llama2c_tokenizer(tok_path, V)
    return config, state, tokenizer


def read_llama2c_tokenizer(path, vocab_size: int):
    """The :class:`~glassllm.tokenizers.sentencepiece.SPTokenizer` of a llama2.c ``tokenizer.bin`` of ``vocab_size`` pieces."""
    from ..tokenizers.sentencepiece import SPACE, SPTokenizer, BYTE_PIECE

    where = str(path)
    data = read_file(path)
    at, pieces = 4, []
    for i in range(vocab_size):
        if at + 8 > len(data):
            raise ValueError(f"{where} has {i} tokens, but the model has vocab_size={vocab_size}; expected the "
                             "model's own tokenizer.bin")
        score, n = struct.unpack_from("<fi", data, at)
        if n < 0 or at + 8 + n > len(data):
            raise ValueError(f"{where}: token {i} has length {n} past the end of the file; expected a llama2.c "
                             "tokenizer.bin")
        try:
            text = data[at + 8:at + 8 + n].decode("utf-8")
        except UnicodeDecodeError:
            raise ValueError(f"{where}: token {i} is not UTF-8 text; expected a llama2.c tokenizer.bin") from None
        at += 8 + n
        if i < 3:
            name = ("<unk>", "<s>", "</s>")[i]
            if text.strip() != name:
                raise ValueError(f"{where}: token {i} is {text!r}; expected {name!r} (llama2.c's ids 0, 1, 2)")
            pieces.append((name, score, "unknown" if i == 0 else "control"))
        else:
            kind = "byte" if BYTE_PIECE.fullmatch(text) else "normal"
            pieces.append((text.replace(" ", SPACE), score, kind))
    if at != len(data):
        raise ValueError(f"{where} holds more than {vocab_size} tokens ({len(data) - at:,} bytes left); expected "
                         "the model's own tokenizer.bin (vocab_size from the model's header)")
    byte_fallback = sum(t == "byte" for _, _, t in pieces) == 256
    try:
        return SPTokenizer(pieces, add_bos=True, add_dummy_prefix=True, byte_fallback=byte_fallback)
    except (TypeError, ValueError) as e:
        raise ValueError(f"{where}: {e}") from None
