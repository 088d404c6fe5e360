"""Files, at the ground floor: reading, atomic writes, folders, and safetensors read and written with NumPy alone.

Every file glassllm reads whole, or opens to read, goes through :func:`read_file` or
:func:`open_file`: a file that is missing or cannot be read is one ``ValueError`` line,
``cannot read 'FILE': reason``. Wherever glassllm takes text to read -- "a str of text, a path,
or an iterable of them" -- :func:`texts_and_files` says which items are text and which are
files (:func:`is_path`), and the files a folder stands for (:func:`text_files`).

Every file glassllm writes goes through :func:`atomic_path` or :func:`atomic_write`:
the data goes to a temporary file in the same folder, is flushed to disk and
then renamed over the target (``os.replace`` is atomic on POSIX): a reader --
or a process killed mid-save -- sees either the old file or the new one, never
half. Every problem (a missing folder, a read-only disk, a full disk) is one
``ValueError`` line naming the path.

This module imports nothing from glassllm but the ground floor's :mod:`glassllm.checks` and
:mod:`glassllm.limits`: the model file
(:mod:`glassllm.checkpoint`), the tokenizer, traces, runs and exports all build on it.
"""

from __future__ import annotations

import errno
import json
import math
import os
import stat
import struct
import tempfile
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from pathlib import Path

import numpy as np

__all__ = [
    "reading", "read_file", "open_file", "one_or_many", "is_path", "folder_texts", "text_files",
    "neither_file_nor_folder", "texts_and_files",
    "atomic_path", "atomic_write", "make_folder", "file_in_folder", "refuse_to_replace", "read_head",
    "starts_like_safetensors",
    "read_safetensors", "read_safetensors_metadata", "encode_safetensors", "write_safetensors", "read_tagged",
    "MAX_HEADER_BYTES", "safetensors_header", "check_header_entries",
]

from .checks import is_int
from .limits import LIMITS, limit, parse_json

MAX_HEADER_BYTES = limit("header_bytes")  # a safetensors header of a model is a few KB; refuse anything absurd


# -- reading --------------------------------------------------------------------------

@contextmanager
def reading(path, what: str = ""):
    """Inside the block, an ``OSError`` (a missing file, a folder, no permission, a failing disk) becomes
    the one ``ValueError`` line ``cannot read [what ]'path': reason``; ``what`` names the kind of file,
    e.g. ``"tokenizer file"``."""
    try:
        yield
    except OSError as e:
        raise ValueError(f"cannot read {_label(path, what)}: {e.strerror or e}") from None


def _label(path, what: str) -> str:
    return f"{what} {str(path)!r}" if what else repr(str(path))


def open_file(path, mode: str = "rb", what: str = "", **options):
    """``open(path, mode, **options)`` for reading, with :func:`reading`'s one-line error."""
    with reading(path, what):
        return open(path, mode, **options)


def read_file(path, what: str = "", max_bytes: int | None = None, limit_of: str = "") -> bytes:
    """The bytes of the file ``path``, with :func:`reading`'s one-line error.

    With ``max_bytes``, a larger file is refused before it is read: ``[what ]'path' is N bytes, over the
    limit of M[ for limit_of]``.
    """
    with reading(path, what), open(path, "rb") as f:
        if max_bytes is not None and (size := os.fstat(f.fileno()).st_size) > max_bytes:
            raise ValueError(f"{_label(path, what)} is {size:,} bytes, over the limit of {max_bytes:,}"
                             + (f" for {limit_of}" if limit_of else ""))
        return f.read()


def one_or_many(value, what: str = "a path") -> Iterable:
    """The items of ``value``: a str or a path is one item; any other iterable (but bytes) is its own items,
    read as they come (a generator is not read ahead). Anything else is a ``TypeError`` line: ``expected
    {what}, or an iterable of them``."""
    if isinstance(value, (str, os.PathLike)):
        return [value]
    if isinstance(value, (bytes, bytearray)) or not isinstance(value, Iterable):
        raise TypeError(f"expected {what}, or an iterable of them, got {type(value).__name__}")
    return value


def is_path(item: str) -> bool:
    """Whether a str names a file or folder rather than being text itself.

    It must be one line and end in ``.txt``, or be an existing file, or hold
    a ``/`` (or ``os.sep``) and exist. Anything else is text (so ``"."`` is
    text); pass ``pathlib.Path`` to leave no doubt.
    """
    if len(item) > 4096 or "\n" in item or "\x00" in item:
        return False
    if item.lower().endswith(".txt") or os.path.isfile(item):
        return True
    return ("/" in item or os.sep in item) and os.path.exists(item)


def folder_texts(folder: Path) -> list[Path]:
    """Every *.txt file below ``folder`` (sorted), hidden files and folders left out: the files a
    folder stands for, to the tokenizers and to ``glassllm train --data`` (:func:`glassllm.data.expand_paths`)."""
    return sorted(f for f in folder.rglob("*.txt")
                  if f.is_file() and not any(part.startswith(".") for part in f.relative_to(folder).parts))


def text_files(path) -> list[Path]:
    """The files a path stands for: itself, or :func:`folder_texts` of a folder."""
    p = Path(path)
    if p.is_file():
        return [p]
    if p.is_dir():
        return folder_texts(p)
    if p.exists():
        raise neither_file_nor_folder(path)
    raise ValueError(f"no such file or folder: {str(path)!r}")


def neither_file_nor_folder(path, label: str = "") -> ValueError:
    """The one-line error for a text path that exists but is neither a file nor a folder (``label``: what
    the path is, before its name: ``"data path "``)."""
    return ValueError(f"{label}{str(path)!r} is not a regular file or folder (a device, a pipe or a socket): "
                      "expected a text file or a folder of .txt files")


def texts_and_files(source) -> Iterator[str | Path]:
    """The items of ``source`` -- a str of text, a path, or an iterable of them -- in order: each a str
    of text, or the ``Path`` of a file (a path to a folder gives its :func:`folder_texts`).

    Paths are any ``os.PathLike``, or a ``str`` that :func:`is_path` accepts. Anything else is a
    ``TypeError`` line.
    """
    for item in one_or_many(source, "text, a path"):
        if isinstance(item, os.PathLike) or (isinstance(item, str) and is_path(item)):
            yield from text_files(item)
        elif isinstance(item, str):
            yield item
        else:
            raise TypeError(f"expected a str of text or a path, got {type(item).__name__}")


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


def file_in_folder(folder, name: str, expected: str, missing: str, label: str = "") -> Path:
    """``folder / name``, when ``folder`` is a folder that holds file ``name``; otherwise one ``ValueError``
    line: ``"LABEL is not a folder; expected EXPECTED"`` (``label`` defaults to the folder's path, quoted),
    or ``missing`` when the file is not there."""
    folder = Path(folder)
    if not folder.is_dir():
        raise ValueError(f"{label or repr(str(folder))} is not a folder; expected {expected}")
    path = folder / name
    if not path.is_file():
        raise ValueError(missing)
    return path


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


def read_head(path, n: int = 4096, what: str = "") -> bytes:
    """The first ``n`` bytes of the file ``path`` (:func:`open_file`'s one-line error if it cannot be read)."""
    with reading(path, what), open(path, "rb") as f:
        return f.read(n)


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


# -- safetensors, read without torch ------------------------------------------------

def starts_like_safetensors(head: bytes) -> bool:
    """Do these first 9 bytes open a safetensors file: a plausible header length (8 bytes,
    little-endian), then the header's ``{``?"""
    return len(head) >= 9 and head[8:9] == b"{" and 2 <= int.from_bytes(head[:8], "little") <= MAX_HEADER_BYTES


_ST_DTYPES = {"F32": np.float32, "F64": np.float64, "F16": np.float16, "BF16": np.uint16,
              "I64": np.int64, "I32": np.int32, "I16": np.int16, "I8": np.int8,
              "U64": np.uint64, "U32": np.uint32, "U16": np.uint16, "U8": np.uint8, "BOOL": np.bool_}
_NP_TO_ST = {np.dtype(t): name for name, t in _ST_DTYPES.items() if name != "BF16"}


def _layout(tensors: dict, metadata) -> tuple[list[str], dict[str, np.ndarray], bytes]:
    """The safetensors layout of ``tensors``: their order (larger items first, then by name, so that every
    tensor starts aligned to its item size), the arrays, and the header (its 8-byte length, then the JSON
    padded with spaces to a multiple of 8 bytes)."""
    meta = dict(metadata or {})
    bad = next((k for k, v in meta.items() if not (isinstance(k, str) and isinstance(v, str))), None)
    if bad is not None:
        raise TypeError(f"safetensors metadata must map str to str; {bad!r} -> {type(meta[bad]).__name__}")
    arrays = {name: np.asarray(a) for name, a in tensors.items()}
    header: dict = {"__metadata__": meta} if meta else {}
    order, offset = sorted(arrays, key=lambda k: (-arrays[k].dtype.itemsize, k)), 0
    for name in order:
        a = arrays[name]
        if a.dtype not in _NP_TO_ST:
            raise TypeError(f"tensor {name!r} has dtype {a.dtype}; safetensors holds "
                            f"{', '.join(str(d) for d in _NP_TO_ST)}")
        header[name] = {"dtype": _NP_TO_ST[a.dtype], "shape": list(a.shape),
                        "data_offsets": [offset, offset + a.nbytes]}
        offset += a.nbytes
    text = json.dumps(header, separators=(",", ":")).encode("utf-8")
    text += b" " * (-len(text) % 8)
    return order, arrays, struct.pack("<Q", len(text)) + text


def _little(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, dtype=a.dtype.newbyteorder("<"))


def encode_safetensors(tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> bytes:
    """The safetensors file that holds ``tensors`` (and the string pairs ``metadata``), as bytes.

    The format's layout: the header's length (8 bytes, little-endian), the JSON header (padded with
    spaces to a multiple of 8 bytes), then every tensor's bytes, little-endian and C-ordered, with no
    gaps; larger items first, so that every tensor starts aligned to its item size.
    :func:`write_safetensors` writes the same bytes to a file a tensor at a time.
    """
    order, arrays, head = _layout(tensors, metadata)
    return head + b"".join(_little(arrays[name]).tobytes() for name in order)


def write_safetensors(path, tensors: dict[str, np.ndarray], metadata: dict[str, str] | None = None) -> None:
    """Write :func:`encode_safetensors`'s bytes to ``path``, atomically, one tensor at a time: beyond what
    the arrays already hold, writing needs at most one copy of one tensor (one that is not contiguous or
    not little-endian), never the whole file in memory."""
    order, arrays, head = _layout(tensors, metadata)
    with atomic_path(path) as tmp:
        with open(tmp, "wb") as f:
            f.write(head)
            for name in order:
                f.write(memoryview(_little(arrays[name]).reshape(-1)).cast("B"))


def read_safetensors_metadata(path) -> dict[str, str]:
    """The ``__metadata__`` string pairs of a safetensors file (empty if it has none), without its tensors.

    A file that is not safetensors is one ``ValueError`` line naming it.
    """
    return dict(safetensors_header(path)[1])


def read_tagged(path, fmt: str, version: str, what: str) -> tuple[dict[str, str], dict[str, np.ndarray]]:
    """The metadata and tensors of a safetensors file whose metadata says ``format`` ``fmt`` and
    ``version`` ``version`` (glassllm's training states and timelines are such files). Anything
    else, or a file that is not safetensors, is one ``ValueError`` line naming the file and ``what``
    it should have been."""
    try:
        meta = read_safetensors_metadata(path)
    except ValueError as e:
        raise ValueError(f"cannot read {what}: {e}") from None
    if meta.get("format") != fmt or meta.get("version") != version:
        raise ValueError(f"{str(path)!r} is not {what} (format {meta.get('format')!r} v{meta.get('version')!r})")
    try:
        return meta, read_safetensors(path)
    except ValueError as e:
        raise ValueError(f"cannot read {what}: {e}") from None


def safetensors_header(path, dtypes=tuple(_ST_DTYPES)) -> tuple[dict, dict, int]:
    """``(entries, metadata, data_start)`` of the safetensors file ``path``: its header read, bounded
    (:mod:`glassllm.limits`) and checked entry by entry (:func:`check_header_entries`) before any tensor
    data is touched. Anything malformed is one ``ValueError`` line naming the file."""
    path = Path(path)
    with reading(path), open(path, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if n < 2 or 8 + n > size or n > MAX_HEADER_BYTES:
            raise ValueError(f"{str(path)!r} is not a safetensors file (bad header length)")
        raw = f.read(n)
    try:
        header = parse_json(raw, "its header", max_bytes=MAX_HEADER_BYTES)
    except ValueError as e:
        raise ValueError(f"{str(path)!r} is not a safetensors file: {e}") from None
    if not isinstance(header, dict):
        raise ValueError(f"{str(path)!r} is not a safetensors file (header is not an object)")
    meta = header.pop("__metadata__", None) or {}
    check_header_entries(header, meta, size - 8 - n, str(path), dtypes)
    return header, meta, 8 + n


def check_header_entries(header: dict, meta, data_len: int, where: str, dtypes) -> None:
    """Every entry of a safetensors header (name -> ``{"dtype", "shape", "data_offsets"}``) well formed:
    at most ``LIMITS["tensors"]`` of them, a dtype in ``dtypes``, a shape of at most
    ``LIMITS["dims"]`` non-negative ints, offsets inside the ``data_len`` bytes of data that span
    exactly the shape's bytes; the metadata str -> str. One ``ValueError`` line naming ``where``."""
    if not isinstance(meta, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in meta.items()):
        raise ValueError(f"{where!r}: its __metadata__ must map strings to strings")
    if len(header) > limit("tensors"):
        raise ValueError(f"{where!r}: its header lists {len(header):,} tensors, over the limit of "
                         f"{limit('tensors'):,}")
    claimed = 0
    for name, info in header.items():
        shape = info.get("shape") if isinstance(info, dict) else None
        offsets = info.get("data_offsets") if isinstance(info, dict) else None
        ok = (isinstance(shape, list) and len(shape) <= limit("dims")
              and all(is_int(s) and s >= 0 for s in shape)
              and isinstance(offsets, list) and len(offsets) == 2)
        if not ok:
            raise ValueError(f"{where!r}: tensor {name[:40]!r} has a malformed header entry (expected dtype, "
                             f"a shape of at most {LIMITS['dims'].value} sizes and two data_offsets)")
        lo, hi = offsets
        if not (is_int(lo) and is_int(hi) and 0 <= lo <= hi <= data_len):
            raise ValueError(f"{where!r}: tensor {name[:40]!r} points outside the file (truncated?)")
        dtype = info.get("dtype")
        if not (isinstance(dtype, str) and dtype in dtypes):
            expected = f"{', '.join(dtypes[:-1])} or {dtypes[-1]}" if len(dtypes) > 1 else dtypes[0]
            raise ValueError(f"{where!r}: tensor {name[:40]!r} has dtype {dtype!r:.40}, expected {expected}")
        if hi - lo != np.dtype(_ST_DTYPES[dtype]).itemsize * math.prod(shape):
            raise ValueError(f"{where!r}: tensor {name[:40]!r} claims shape {tuple(shape)} "
                             f"but holds {hi - lo} bytes")
        claimed += hi - lo
    if claimed > data_len:                 # offsets that overlap would make a few bytes read as many tensors
        raise ValueError(f"{where!r}: its tensors claim {claimed:,} bytes but the file holds {data_len:,} "
                         "(overlapping data offsets); expected each tensor's own bytes")


def read_safetensors(path, wanted: set[str] | None = None, mmap: bool = True) -> dict[str, np.ndarray]:
    """Every tensor of one safetensors file (or those named in ``wanted``) as float32/float64 arrays.

    Read with the standard library and NumPy only (no torch, never a pickle). F32 and F64 keep
    their type and, with ``mmap`` (the default), are views into a copy-on-write memory map of the
    file: nothing is read until a value is used, the pages count once (as the file's, shared with
    the page cache), and writing to an array changes this process's copy only, never the file.
    Integer and BOOL tensors keep their type too. F16 and BF16 are widened to float32 exactly,
    tensor by tensor, here, when the file is read (each widened tensor is an ordinary array of twice
    the bytes). ``mmap=False`` reads every tensor into memory of its own. A malformed header or a
    tensor whose offsets do not fit the file, or a file that cannot be read (:func:`reading`), is one
    ``ValueError`` line naming the file.

    A mapped file must not be rewritten in place while its arrays live (glassllm never does: its
    writes replace a file by renaming, and the mapped old file stays intact).
    """
    import mmap as mmap_module

    header, _, start = safetensors_header(path)
    out = {}
    with reading(path), open(path, "rb") as f:
        mapped = None
        if mmap and os.fstat(f.fileno()).st_size > start:
            mapped = mmap_module.mmap(f.fileno(), 0, access=mmap_module.ACCESS_COPY)
        for name, info in header.items():
            if wanted is not None and name not in wanted:
                continue
            dtype, shape = info["dtype"], tuple(info["shape"])
            lo, hi = info["data_offsets"]
            stored = np.dtype(_ST_DTYPES[dtype]).newbyteorder("<")
            if mapped is not None and hi > lo:
                raw = np.frombuffer(mapped, dtype=stored, count=(hi - lo) // stored.itemsize, offset=start + lo)
            else:
                f.seek(start + lo)
                raw = np.frombuffer(bytearray(f.read(hi - lo)), dtype=stored)
            if dtype == "BF16":  # bfloat16 is the top half of a float32
                arr = (raw.astype(np.uint32) << 16).view(np.float32)
            elif dtype == "F16":
                arr = raw.astype(np.float32)
            else:
                native = raw.dtype.newbyteorder("=")
                arr = raw.view(native) if raw.dtype.isnative else raw.astype(native)
            out[name] = arr.reshape(shape)
    return out
