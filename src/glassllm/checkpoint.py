"""The glassllm model file.

A model file is one safetensors file that holds everything inference needs:

- tensors: the model's parameters under their LLaMA names (:mod:`glassllm.nn`);
- metadata (str -> str): ``format`` = ``"glassllm-model"``, ``version`` = ``"1"``,
  ``config`` (the :class:`~glassllm.config.ModelConfig` as JSON), ``tokenizer``
  (the tokenizer's own JSON document, see :mod:`glassllm.tokenizers`: its
  ``kind`` says byte-level or SentencePiece; none means byte-level) and any
  extra string fields the writer adds (a training run adds its step, say).

Loading never unpickles anything. The header is read first and every tensor's
name, dtype and shape is checked against the config *before* any tensor data
is read, so a crafted file with absurd shapes is refused without a large
allocation. Every problem is reported as one ``ValueError`` line that names
the file and what was expected.

Writes are atomic (:func:`glassllm.files.atomic_write`): a reader -- or a
process killed mid-save -- sees either the old file or the new one, never half.
The file helpers (``atomic_write``, ``atomic_path``, ``make_folder``,
``refuse_to_replace``, ``read_head``, ``starts_like_safetensors``) live in
:mod:`glassllm.files` and are also importable from here.
"""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np

from .config import ModelConfig
from .files import (MAX_HEADER_BYTES, atomic_path, atomic_write, check_header_entries, make_folder, read_head,
                    read_safetensors, reading, refuse_to_replace, starts_like_safetensors, write_safetensors)
from .limits import parse_json
from .nn import Transformer, model_dtype
from .tokenizers import TextTokenizer, tokenizer_from_json

__all__ = [
    "FORMAT", "VERSION", "atomic_write", "atomic_path", "make_folder", "save_model", "load_model",
    "read_header", "read_head", "bundled_model_path", "load_bundled", "refuse_to_replace", "is_model_file",
    "starts_like_safetensors",
]

FORMAT = "glassllm-model"
VERSION = "1"
_DTYPES = {"F32": np.float32, "F64": np.float64}


# ----------------------------------------------------------------------------
# Model files
# ----------------------------------------------------------------------------

def save_model(path, model, tokenizer, metadata: dict[str, str] | None = None) -> None:
    """Write ``model`` and ``tokenizer`` as one model file at ``path`` (atomically, a tensor at a time:
    no copy of the whole file is built in memory)."""
    if not isinstance(model, Transformer):
        raise TypeError(f"model must be a glassllm Transformer, got {type(model).__name__}")
    if not isinstance(tokenizer, TextTokenizer):
        raise TypeError(f"tokenizer must be a glassllm tokenizer (Tokenizer or SPTokenizer), "
                        f"got {type(tokenizer).__name__}")
    if metadata is not None and not isinstance(metadata, dict):
        raise TypeError(f"metadata must be a dict of str to str, got {type(metadata).__name__}")
    model_dtype(model.dtype)                                            # a file load_model can read back
    if tokenizer.vocab_size != model.config.vocab_size:
        raise ValueError(
            f"tokenizer has {tokenizer.vocab_size} ids but the model expects {model.config.vocab_size}"
        )
    meta = {"format": FORMAT, "version": VERSION, "config": model.config.to_json(),
            "tokenizer": tokenizer.to_json()}
    for key, value in (metadata or {}).items():
        if key in meta:
            raise ValueError(f"metadata key {key!r} is reserved")
        meta[key] = str(value)
    write_safetensors(path, model.state_dict(), meta)


def read_header(path) -> tuple[dict, dict[str, str]]:
    """Read and validate a safetensors header without reading any tensor data.

    Returns ({name: {"dtype", "shape", "data_offsets"}}, metadata).
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"model file {str(path)!r} does not exist")
    if not path.is_file():
        raise ValueError(f"model file {str(path)!r} is not a regular file")
    with reading(path, "model file"), open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        if len(head) < 8:
            raise ValueError(f"{str(path)!r} is not a glassllm model file: only {size} bytes long")
        n = int.from_bytes(head, "little")
        if 8 + n > size and starts_like_safetensors(head + f.read(1)):
            raise ValueError(f"{str(path)!r} is truncated: its safetensors header alone claims {n} bytes, "
                             f"and the whole file has {size}")
        if n < 2 or n > MAX_HEADER_BYTES or 8 + n > size:
            raise ValueError(f"{str(path)!r} is not a glassllm model file: "
                             f"{_looks_like(head) or f'bad safetensors header length {n}'}")
        raw = f.read(n)
    try:
        header = parse_json(raw, "its header", max_bytes=MAX_HEADER_BYTES)
    except ValueError:
        raise ValueError(f"{str(path)!r} is not a glassllm model file: its header is not JSON") from None
    if not isinstance(header, dict):
        raise ValueError(f"{str(path)!r} is not a glassllm model file: its header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} is not a glassllm model file (metadata format is "
                         f"{meta.get('format') if isinstance(meta, dict) else None!r:.40}, expected {FORMAT!r})")
    if meta.get("version") != VERSION:
        raise ValueError(f"{str(path)!r} has model file version {meta.get('version')!r:.40}; "
                         f"this glassllm reads {VERSION!r}")
    check_header_entries(header, meta, size - 8 - n, str(path), tuple(_DTYPES))
    return header, meta


def is_model_file(path) -> bool:
    """Is ``path`` a glassllm model file (by its header, without reading the tensors)?"""
    try:
        return read_header(path)[1].get("format") == FORMAT
    except (ValueError, OSError):
        return False


def _looks_like(head: bytes) -> str:
    """What a file that is not safetensors seems to be, from its first bytes ('' if unknown)."""
    if head[:1] == b"\x80" and 2 <= head[1] <= 5:  # PROTO opcode and a protocol number
        return "it is a Python pickle (a PyTorch .bin/.pt?), which glassllm never loads"
    if head[:2] == b"PK":
        return "it is a zip archive (a PyTorch checkpoint or a trace file?), not safetensors"
    if head.lstrip(b" \t\r\n\xef\xbb\xbf")[:1] in (b"{", b"["):
        return "it is JSON text (a tokenizer or config file?), not safetensors"
    return ""


def load_model(path, dtype=None, mmap: bool = True):
    """Load a model file: returns ``(model, tokenizer, metadata)``.

    Every tensor's name, dtype and shape is checked against the stored config
    before any data is read. ``dtype`` casts the parameters (default: as stored). The tensors are read
    with NumPy alone (:func:`glassllm.files.read_safetensors`).

    With ``mmap`` (the default) the parameters are views into a copy-on-write memory map of
    the file: loading reads each value once, to check that it is finite, and allocates no second
    copy of the weights; training such a model changes its pages in this process only. A ``dtype``
    other than the stored one casts (a copy), as does ``mmap=False``. No initial weights are drawn
    (:class:`~glassllm.nn.Transformer` ``init=False``).
    """
    if dtype is not None:
        dtype = model_dtype(dtype)
    header, meta = read_header(path)
    name = str(path)
    try:
        config = ModelConfig.from_json(meta.get("config", ""))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name!r}: bad model config: {e}") from None
    try:
        tokenizer = tokenizer_from_json(meta.get("tokenizer", ""))
    except (TypeError, ValueError) as e:
        raise ValueError(f"{name!r}: bad tokenizer: {e}") from None
    if tokenizer.vocab_size != config.vocab_size:
        raise ValueError(f"{name!r}: tokenizer has {tokenizer.vocab_size} ids but the config says "
                         f"vocab_size={config.vocab_size}")

    # Shapes come from the config by arithmetic: nothing is allocated until every
    # tensor in the header matches them, so the weights are at most the file's size.
    expected = config.param_shapes()
    stored_dtypes = set()
    for key, info in header.items():
        if key not in expected:
            raise ValueError(f"{name!r}: unexpected tensor {key!r}")
        if tuple(info["shape"]) != expected[key]:
            raise ValueError(f"{name!r}: tensor {key!r} has shape {tuple(info['shape'])}, expected {expected[key]}")
        stored_dtypes.add(info["dtype"])                                # checked by read_header
    missing = sorted(set(expected) - set(header))
    if missing:
        raise ValueError(f"{name!r}: missing tensor {missing[0]!r}")
    config.check_tables(Path(path).stat().st_size, name)

    target = dtype if dtype is not None else _DTYPES[max(stored_dtypes)]  # "F64" > "F32"
    state = read_safetensors(path, set(expected), mmap=mmap)          # (one line if the file cannot be read)
    model = Transformer(config, dtype=target, init=False)
    try:
        model.load_state_dict(state, copy=not mmap)
    except ValueError as e:
        raise ValueError(f"{name!r}: {e}") from None
    return model, tokenizer, meta


def bundled_model_path() -> Path:
    """The model trained on TinyStories that ships inside the package."""
    return Path(__file__).parent / "assets" / "tinystories.safetensors"


def load_bundled(dtype=None):
    """Load the bundled TinyStories model: ``(model, tokenizer, metadata)``."""
    path = bundled_model_path()
    if not path.exists():
        raise ValueError(f"the bundled model {str(path)!r} is missing from this installation")
    return load_model(path, dtype)
