"""The glassllm model file, and atomic file writes.

A model file is one safetensors file that holds everything inference needs:

- tensors: the model's parameters under their LLaMA names (:mod:`glassllm.nn`);
- metadata (str -> str): ``format`` = ``"glassllm-model"``, ``version`` = ``"1"``,
  ``config`` (the :class:`~glassllm.config.ModelConfig` as JSON), ``tokenizer``
  (the tokenizer's own JSON document, see :mod:`glassllm.tokenizing`: its
  ``kind`` says byte-level or SentencePiece; none means byte-level) and any
  extra string fields the writer adds (a training run adds its step, say).

Loading never unpickles anything. The header is read first and every tensor's
name, dtype and shape is checked against the config *before* any tensor data
is read, so a crafted file with absurd shapes is refused without a large
allocation. Every problem is reported as one ``ValueError`` line that names
the file and what was expected.

Writes go to a temporary file in the same folder, are flushed to disk and then
renamed over the target (``os.replace`` is atomic on POSIX): a reader -- or a
process killed mid-save -- sees either the old file or the new one, never half.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np

from .config import ModelConfig

__all__ = [
    "FORMAT", "VERSION", "atomic_write", "atomic_path", "make_folder", "save_model", "load_model",
    "read_header", "read_head", "bundled_model_path", "load_bundled", "refuse_to_replace", "is_model_file",
]

FORMAT = "glassllm-model"
VERSION = "1"
_DTYPES = {"F32": np.float32, "F64": np.float64}
MAX_HEADER_BYTES = 16 << 20  # a model header is a few KB; refuse anything absurd
MAX_TABLE_BYTES = 64 << 20   # position tables a small model file may ask for (see _check_tables)


@contextmanager
def atomic_path(path):
    """Yield a temporary path next to ``path``; on success rename it over ``path``.

    If the block fails, the temporary file is removed and ``path`` is left as
    it was; an ``OSError`` (a full disk, say) becomes one ``ValueError`` line
    naming ``path``.

    >>> with atomic_path("out.bin") as tmp:   # doctest: +SKIP
    ...     np.save(tmp, array)
    """
    if not str(path).strip():
        raise ValueError("cannot write '': empty path; name a file")
    path = Path(path)
    if path.exists() and not path.is_file():   # (exists and is_file follow symbolic links)
        kind = "a folder" if path.is_dir() else "not a regular file (a device, a pipe or a socket)"
        raise ValueError(f"cannot write {str(path)!r}: it is {kind}")
    if path.is_symlink():                      # write the file the link names; the link stays a link
        path = Path(os.path.realpath(path))
    folder = path.parent if str(path.parent) else Path(".")
    if not folder.is_dir():
        raise ValueError(f"cannot write {str(path)!r}: folder {str(folder)!r} does not exist")
    try:
        # The OS decides what is writable (os.access would not see a read-only file system as root).
        fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=folder)
    except OSError as e:
        raise ValueError(f"cannot write {str(path)!r}: {_why(e, folder)}") from None
    os.close(fd)
    # mkstemp makes 0600: a replaced file keeps its own permissions, a new one gets ordinary ones
    os.chmod(tmp, stat.S_IMODE(path.stat().st_mode) if path.is_file() else 0o666 & ~_umask())
    try:
        yield Path(tmp)
        with open(tmp, "rb") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        _fsync_dir(folder)
    except BaseException as e:
        try:
            os.unlink(tmp)
        except FileNotFoundError:
            pass
        if isinstance(e, OSError):  # a full disk, a quota, a file size limit: one line, the target kept
            raise ValueError(f"cannot write {str(path)!r}: {_why(e, folder)}") from None
        raise


def make_folder(path) -> Path:
    """Create the folder ``path`` and its parents if needed; a ``ValueError`` line if the OS refuses."""
    path = Path(path)
    try:
        path.mkdir(parents=True, exist_ok=True)
    except FileExistsError:
        raise ValueError(f"cannot create folder {str(path)!r}: a file of that name is in the way") from None
    except OSError as e:
        parent = next((p for p in path.parents if p.exists()), Path("."))
        raise ValueError(f"cannot create folder {str(path)!r}: {_why(e, parent)}") from None
    return path


def _why(e: OSError, folder: Path) -> str:
    """The reason an OSError gives, in words: a refused folder is named as not writable."""
    if e.errno in (errno.EACCES, errno.EPERM, errno.EROFS):
        return f"folder {str(folder)!r} is not writable"
    if e.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        return f"no room: the disk is full or a size limit was reached ({e.strerror})"
    return e.strerror or str(e)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def refuse_to_replace(path, what: str, kind: str, is_kind, inputs=()) -> None:
    """Before a command writes ``path``: a ValueError if it is one of the command's ``inputs``, or an existing
    file that is not a ``kind`` (``is_kind(path)`` is False) -- a typo must not destroy a model or the training
    text. A file of the same kind is replaced (running a command again is normal). ``what`` names the
    option, e.g. ``"--out"``."""
    p = Path(path)
    if not p.exists():
        return
    for source in inputs:
        if source is not None and Path(source).exists() and os.path.samefile(p, source):
            raise ValueError(f"{what} {str(p)!r} is also this command's input: writing it would destroy it; "
                             "choose another file")
    if p.is_file() and p.stat().st_size and not is_kind(p):
        raise ValueError(f"{what} {str(p)!r} already exists and is not {kind}: not replacing it; choose another "
                         "file, or remove it first")


def read_head(path, n: int = 4096) -> bytes:
    """The first ``n`` bytes of the file ``path``."""
    with open(path, "rb") as f:
        return f.read(n)


def is_model_file(path) -> bool:
    """Is ``path`` a glassllm model file (by its header, without reading the tensors)?"""
    try:
        return read_header(path)[1].get("format") == FORMAT
    except (ValueError, OSError):
        return False


def atomic_write(path, data: bytes | str) -> None:
    """Write ``data`` to ``path`` atomically (temporary file, fsync, rename)."""
    if isinstance(data, str):
        data = data.encode("utf-8")
    try:
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                f.write(data)
                f.flush()
                os.fsync(f.fileno())
    except OSError as e:
        raise ValueError(f"cannot write {str(path)!r}: {e.strerror or e}") from None


def _fsync_dir(folder: Path) -> None:
    try:
        fd = os.open(folder, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:
        pass
    finally:
        os.close(fd)


# ----------------------------------------------------------------------------
# Model files
# ----------------------------------------------------------------------------

def save_model(path, model, tokenizer, metadata: dict[str, str] | None = None) -> None:
    """Write ``model`` and ``tokenizer`` as one model file at ``path`` (atomically)."""
    from safetensors.numpy import save

    from .nn import Transformer, model_dtype
    from .tokenizing import TextTokenizer

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
    tensors = {name: np.ascontiguousarray(p) for name, p in model.state_dict().items()}
    atomic_write(path, save(tensors, metadata=meta))


def starts_like_safetensors(head: bytes) -> bool:
    """Do these first 9 bytes open a safetensors file: a plausible header length (8 bytes,
    little-endian), then the header's ``{``?"""
    return len(head) >= 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= MAX_HEADER_BYTES


def read_header(path) -> tuple[dict, dict[str, str]]:
    """Read and validate a safetensors header without reading any tensor data.

    Returns ({name: {"dtype", "shape", "data_offsets"}}, metadata).
    """
    path = Path(path)
    if not path.exists():
        raise ValueError(f"model file {str(path)!r} does not exist")
    if not path.is_file():
        raise ValueError(f"model file {str(path)!r} is not a regular file")
    size = path.stat().st_size
    with open(path, "rb") as f:
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
        header = json.loads(raw.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError, RecursionError):
        raise ValueError(f"{str(path)!r} is not a glassllm model file: its header is not JSON") from None
    if not isinstance(header, dict):
        raise ValueError(f"{str(path)!r} is not a glassllm model file: its header is not a JSON object")
    meta = header.pop("__metadata__", None) or {}
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise ValueError(f"{str(path)!r} is not a glassllm model file (metadata format is "
                         f"{meta.get('format') if isinstance(meta, dict) else None!r}, expected {FORMAT!r})")
    if meta.get("version") != VERSION:
        raise ValueError(f"{str(path)!r} has model file version {meta.get('version')!r}; this glassllm reads {VERSION!r}")
    data_len = size - 8 - n
    for name, info in header.items():
        ok = (isinstance(info, dict) and isinstance(info.get("shape"), list)
              and all(isinstance(s, int) and s >= 0 for s in info["shape"])
              and isinstance(info.get("data_offsets"), list) and len(info["data_offsets"]) == 2)
        if not ok:
            raise ValueError(f"{str(path)!r}: tensor {name!r} has a malformed header entry")
        lo, hi = info["data_offsets"]
        if not (isinstance(lo, int) and isinstance(hi, int) and 0 <= lo <= hi <= data_len):
            raise ValueError(f"{str(path)!r}: tensor {name!r} points outside the file (truncated?)")
        dtype = info.get("dtype")
        if not (isinstance(dtype, str) and dtype in _DTYPES):
            raise ValueError(f"{str(path)!r}: tensor {name!r} has dtype {dtype!r:.40}, expected F32 or F64")
        if hi - lo != np.dtype(_DTYPES[dtype]).itemsize * math.prod(info["shape"]):
            raise ValueError(f"{str(path)!r}: tensor {name!r} claims shape {tuple(info['shape'])} "
                             f"but holds {hi - lo} bytes")
    return header, meta


def _looks_like(head: bytes) -> str:
    """What a file that is not safetensors seems to be, from its first bytes ('' if unknown)."""
    if head[:1] == b"\x80" and 2 <= head[1] <= 5:  # PROTO opcode and a protocol number
        return "it is a Python pickle (a PyTorch .bin/.pt?), which glassllm never loads"
    if head[:2] == b"PK":
        return "it is a zip archive (a PyTorch checkpoint or a trace file?), not safetensors"
    if head.lstrip(b" \t\r\n\xef\xbb\xbf")[:1] in (b"{", b"["):
        return "it is JSON text (a tokenizer or config file?), not safetensors"
    return ""


def load_model(path, dtype=None):
    """Load a model file: returns ``(model, tokenizer, metadata)``.

    Every tensor's name, dtype and shape is checked against the stored config
    before any data is read. ``dtype`` casts the parameters (default: as stored).
    """
    from safetensors import safe_open

    from .hf import _param_shapes
    from .nn import Transformer, model_dtype
    from .tokenizing import tokenizer_from_json

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
    expected = _param_shapes(config)
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
    _check_tables(config, path, name)

    target = dtype if dtype is not None else _DTYPES[max(stored_dtypes)]  # "F64" > "F32"
    state = {}
    try:
        with safe_open(str(path), framework="numpy") as f:
            for key in expected:
                state[key] = f.get_tensor(key)
    except Exception as e:  # safetensors raises its own error types
        raise ValueError(f"{name!r}: cannot read tensors: {e}") from None
    model = Transformer(config, seed=0, dtype=target)
    try:
        model.load_state_dict(state)
    except ValueError as e:
        raise ValueError(f"{name!r}: {e}") from None
    return model, tokenizer, meta


def _check_tables(config: ModelConfig, path, name: str) -> None:
    """Refuse a config whose position tables would dwarf the weights the file holds.

    The rotary cos/sin tables (and a KV cache) grow with ``max_seq_len``, which
    costs no bytes in the file: a crafted config could ask for billions of
    positions. Their size may not exceed the file's size or 64 MiB, whichever is larger.
    """
    table = config.max_seq_len * config.head_dim * 16                  # cos, sin: float64 + a cast copy
    budget = max(Path(path).stat().st_size, MAX_TABLE_BYTES)
    if table > budget:
        raise ValueError(f"{name!r}: max_seq_len={config.max_seq_len} needs {table / 2**20:.0f} MiB of "
                         f"position tables, more than this file's weights justify "
                         f"(at most {budget // (config.head_dim * 16)} positions)")


def bundled_model_path() -> Path:
    """The model trained on TinyStories that ships inside the package."""
    return Path(__file__).parent / "assets" / "tinystories.safetensors"


def load_bundled(dtype=None):
    """Load the bundled TinyStories model: ``(model, tokenizer, metadata)``."""
    path = bundled_model_path()
    if not path.exists():
        raise ValueError(f"the bundled model {str(path)!r} is missing from this installation")
    return load_model(path, dtype)
