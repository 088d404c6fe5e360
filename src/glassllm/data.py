"""Training data: text files -> cached token ids -> seeded random windows.

The pipeline, one function each:

1. :func:`expand_paths` turns ``--data`` arguments (files or folders) into an
   ordered list of files. A folder contributes its ``*.txt`` files, recursively,
   in sorted order; hidden files are skipped.
2. :func:`token_ids` tokenises the files once (``Tokenizer.encode_corpus``:
   stories separated by the end-of-text id) and caches the ids as a ``.npy``
   file of ``uint16`` that is opened memory-mapped. The cache file is named by
   a SHA-256 over the files' own SHA-256s and the tokenizer's JSON, so editing a
   file or changing the tokenizer can never reuse stale ids.
3. :class:`WindowSampler` draws batches of random windows of ``seq_len + 1``
   consecutive ids from a seeded ``np.random.Generator``: inputs are the first
   ``seq_len`` ids, targets the last ``seq_len`` (shifted by one). Its whole
   position in the data is the generator's state, which it exports and
   restores exactly.

Stories that ship with glassllm, for training offline: ``--data glassllm:stories``
(4,000 TinyStories stories, 3.4 MB of text) and ``glassllm:stories-heldout`` (200 other
stories), read from the package's compressed files (:data:`SHIPPED_SOURCES`; their origin and
licence: ``assets/STORIES_NOTICE.md``). ``glassllm train`` uses them when given no ``--data``.

TinyStories from the Hugging Face hub (:func:`fetch_hub_file`) for users with
internet: ``--data tinystories:train`` downloads ``TinyStoriesV2-GPT4-train.txt``
from the dataset ``roneneldan/TinyStories`` (about 2 GB; ``tinystories:valid``
is its 20 MB validation file; ``tinystories-v1:train`` / ``-v1:valid`` are the
first release). The URL layout is the hub's
``{endpoint}/datasets/{repo}/resolve/{revision}/{file}``; the endpoint defaults
to ``$HF_ENDPOINT`` or ``https://huggingface.co``. Downloads are streamed to a
temporary file, checked against the Content-Length and, when the server sends
one, the SHA-256 ETag, and renamed into place; a finished file is not fetched
again.
"""

from __future__ import annotations

import hashlib
import http.client
import json
import lzma
import os
import re
import urllib.error
import urllib.parse
import urllib.request
from pathlib import Path

import numpy as np

from .files import atomic_path, folder_texts, make_folder, neither_file_nor_folder, one_or_many, read_file
from .optional import require
from .tokenizers.corpus import EOT

__all__ = [
    "expand_paths", "file_sha256", "text_sha256s", "token_ids", "WindowSampler", "doc_start_id", "doc_starts",
    "HUB_SOURCES", "hub_url", "fetch_hub_file", "hub_source", "resolve_sources", "default_cache_dir",
    "SHIPPED_SOURCES", "DEFAULT_TRAIN", "DEFAULT_VALID", "shipped_source", "shipped_text",
]

CACHE_FORMAT = "glassllm-token-cache v2"   # v2: an end-of-text id between files that lack one


# ----------------------------------------------------------------------------
# Files
# ----------------------------------------------------------------------------

def expand_paths(paths) -> list[Path]:
    """Files named by ``paths`` (str/Path or a list of them), folders expanded to their ``*.txt``.

    Raises ValueError for a missing path, one that is not a regular file or folder (a device, a
    pipe or a socket), an empty folder, or no files at all.
    """
    files: list[Path] = []
    for raw in one_or_many(paths):
        path = Path(raw)
        if path.is_dir():
            found = folder_texts(path)
            if not found:
                raise ValueError(f"data folder {str(path)!r} holds no .txt files")
            files.extend(found)
        elif path.is_file():
            files.append(path)
        elif path.exists():
            raise neither_file_nor_folder(path, "data path ")
        else:
            raise ValueError(f"data path {str(path)!r} does not exist")
    if not files:
        raise ValueError("no data files given: expected at least one text file or folder")
    return files


def file_sha256(path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def text_sha256s(files) -> list[str]:
    """SHA-256 of each file, in order (what a checkpoint records about its data)."""
    return [file_sha256(f) for f in files]


def default_cache_dir() -> Path:
    """``$GLASSLLM_CACHE`` or ``~/.cache/glassllm``."""
    return Path(os.environ.get("GLASSLLM_CACHE") or Path.home() / ".cache" / "glassllm")


# ----------------------------------------------------------------------------
# Token cache
# ----------------------------------------------------------------------------

def cache_key(file_hashes: list[str], tokenizer) -> str:
    h = hashlib.sha256()
    h.update(json.dumps({"format": CACHE_FORMAT, "files": list(file_hashes)}, sort_keys=True).encode())
    h.update(tokenizer.to_json().encode("utf-8"))
    return h.hexdigest()


def _ends_with_eot(path) -> bool:
    """Does the file's text end with ``<|endoftext|>`` (trailing whitespace aside)?"""
    with open(path, "rb") as f:
        f.seek(0, os.SEEK_END)
        f.seek(max(0, f.tell() - 4096))
        return f.read().rstrip().endswith(EOT.encode())


def token_ids(files, tokenizer, cache_dir, file_hashes: list[str] | None = None) -> np.ndarray:
    """The token ids of ``files`` (each encoded with ``Tokenizer.encode_corpus``) as a read-only memmap.

    Files are documents: between two files, unless the first already ends with
    an ``<|endoftext|>`` line, the end-of-text id is put in, so that a folder of
    one story per file is read as separate stories, as one file with separator
    lines would be. Tokenised once: the ids live in
    ``cache_dir/tokens-<key>.npy`` (uint16), where the key hashes the files'
    contents and the tokenizer. Returns a 1-D ``np.memmap`` of ``uint16``.
    """
    files = expand_paths(files)
    if tokenizer.vocab_size > 65536:
        raise ValueError(f"vocabulary of {tokenizer.vocab_size} ids does not fit the uint16 token cache")
    hashes = file_hashes if file_hashes is not None else text_sha256s(files)
    cache_dir = make_folder(cache_dir)
    path = cache_dir / f"tokens-{cache_key(hashes, tokenizer)[:24]}.npy"
    if not path.exists():
        eot = tokenizer.special_tokens.get(EOT)
        parts = []
        for k, file in enumerate(files):
            parts.append(np.asarray(tokenizer.encode_corpus(file)))   # a Path: never mistaken for text
            if eot is not None and k < len(files) - 1 and not _ends_with_eot(file):
                parts.append(np.array([eot], dtype=np.uint16))
        ids = np.concatenate(parts)                                 # expand_paths gave at least one file
        if ids.ndim != 1 or ids.size == 0:
            raise ValueError(f"tokenising {len(files)} file(s) gave no tokens")
        if ids.dtype != np.uint16:
            ids = ids.astype(np.uint16)
        with atomic_path(path) as tmp:
            with open(tmp, "wb") as f:
                np.save(f, ids)
    return np.load(path, mmap_mode="r")


# ----------------------------------------------------------------------------
# Batches
# ----------------------------------------------------------------------------

def _distinct(ids) -> np.ndarray:
    """The distinct ids of a (memory-mapped) token array, sorted; counted in chunks, so a large
    file is never copied whole into int64."""
    counts = np.zeros(0, dtype=np.int64)
    for start in range(0, len(ids), 1 << 22):
        part = np.bincount(np.asarray(ids[start:start + (1 << 22)], dtype=np.int64))
        if len(part) > len(counts):
            counts = np.concatenate([counts, np.zeros(len(part) - len(counts), dtype=np.int64)])
        counts[:len(part)] += part
    return np.flatnonzero(counts)


def doc_start_id(tokenizer) -> int | None:
    """The id a document starts from: ``<s>`` for a tokenizer that puts it first, else ``<|endoftext|>``
    (a glassllm model starts a fresh story after it); None if the tokenizer has neither."""
    if getattr(tokenizer, "bos_id", None) is not None:
        return int(tokenizer.bos_id)
    return tokenizer.special_tokens.get(EOT)


def doc_starts(ids, start_id: int, tokenizer=None) -> np.ndarray:
    """Where documents start in a (memory-mapped) token array, in order: the positions of ``start_id``.

    With a ``tokenizer`` that puts nothing before a prompt (glassllm's: ``bos_id`` None), also
    the position of each story's first token, after the ``<|endoftext|>`` and the newline that
    follows it in a story file: a prompt is read from there.
    """
    found = [np.flatnonzero(np.asarray(ids[k:k + (1 << 22)]) == start_id) + k for k in range(0, len(ids), 1 << 22)]
    starts = np.concatenate(found).astype(np.int64) if found else np.zeros(0, dtype=np.int64)
    if tokenizer is None or getattr(tokenizer, "bos_id", None) is not None:
        return starts
    newline = tokenizer.encode("\n")
    first = starts + 1
    first = first[first < len(ids)]
    if len(newline) == 1:                                    # "<|endoftext|>" "\n" story: skip the newline
        first = first + (np.asarray(ids[first]) == newline[0])
    return np.unique(np.concatenate([starts, first[first < len(ids)]]))


REPEAT_TOKENS = ("text", "random")  # what a repeated window's span is made of (see WindowSampler)


class WindowSampler:
    """Random windows of a token stream, from a seeded generator.

    ``next_batch()`` returns ``(x, y)``, both (B, T) int64: for each row a start
    s is drawn uniformly from 0 .. len(ids) - T - 1 and ``x = ids[s : s+T]``,
    ``y = ids[s+1 : s+T+1]``. :meth:`state` / :meth:`set_state` save and restore
    the exact position (the bit generator's state and the batch count).

    With ``repeat_fraction`` r > 0, each row is, with probability r, a *repeated*
    window instead: a period h is drawn uniformly from ceil((T+1)/8) .. ceil((T+1)/2),
    and the row is ``ids[s : s+h]`` over and over (row[i] = ids[s + i % h]), so
    everything after the first h tokens can be predicted by copying. Because h
    varies, no fixed look-back distance finds the copy: the model has to match
    content -- find where the current token occurred before, and read what came
    next (an induction head). ``repeat_tokens`` says what the span is made of:
    ``"text"``, the h tokens of text at s; or ``"random"``, h tokens drawn
    independently and uniformly from the ids that occur in the data: its first
    copy is unpredictable, and copying is the only way to predict the rest. With
    r = 0 the sampler draws exactly the same numbers as one without the option.

    With ``doc_starts`` (the positions of the documents' start tokens: ``<|endoftext|>``
    before each story, or ``<s>``) and ``doc_start_fraction`` d > 0, each row starts,
    with probability d, at a document's start token instead of at an arbitrary
    offset (a start drawn uniformly from those with a whole window after them), so
    the window holds a story from its beginning, and the story's end token is
    predicted with all of the story in view. With d = 0 nothing more is drawn.

    The draws per batch: B starts, then (d > 0) B uniforms for "document start?" and
    B indices into the document starts, then (r > 0) B uniforms for "repeat?", B
    periods, and ("random") B x (T+1) indices into the sorted distinct ids.
    ``next_batch(seq_len, batch_size, repeat_fraction)`` draws one batch of another
    shape, or with another share of repeated windows, from the same stream (the
    trainer's sequence-length warm-up uses it).

    >>> s = WindowSampler(np.arange(10, dtype=np.uint16), seq_len=3, batch_size=2,
    ...                   rng=np.random.default_rng(0))
    >>> x, y = s.next_batch()
    >>> bool(np.all(y == x + 1)), x.shape
    (True, (2, 3))
    """

    def __init__(self, ids: np.ndarray, seq_len: int, batch_size: int, rng: np.random.Generator,
                 repeat_fraction: float = 0.0, repeat_tokens: str = "text", doc_starts=None,
                 doc_start_fraction: float = 0.0):
        if not isinstance(rng, np.random.Generator):
            raise TypeError(f"rng must be a numpy Generator, got {type(rng).__name__}")
        if len(ids) < seq_len + 1:
            raise ValueError(f"the data has {len(ids)} tokens, fewer than one window of seq_len + 1 = {seq_len + 1}")
        if not 0.0 <= repeat_fraction <= 1.0:
            raise ValueError(f"repeat_fraction must be between 0 and 1, got {repeat_fraction!r}")
        if repeat_tokens not in REPEAT_TOKENS:
            raise ValueError(f"repeat_tokens must be one of {', '.join(REPEAT_TOKENS)}, got {repeat_tokens!r}")
        self.ids, self.seq_len, self.batch_size, self.rng = ids, int(seq_len), int(batch_size), rng
        self.repeat_fraction = float(repeat_fraction)
        self.repeat_tokens = repeat_tokens
        if not 0.0 <= doc_start_fraction <= 1.0:
            raise ValueError(f"doc_start_fraction must be between 0 and 1, got {doc_start_fraction!r}")
        if doc_start_fraction > 0 and doc_starts is None:
            raise ValueError("doc_start_fraction > 0 needs doc_starts: the positions of the documents' start tokens")
        self.doc_starts = None if doc_starts is None else np.sort(np.asarray(doc_starts, dtype=np.int64))
        self.doc_start_fraction = float(doc_start_fraction)
        self._types = None            # the distinct ids, counted once a random span needs them
        self.batches = 0

    def next_batch(self, seq_len: int | None = None, batch_size: int | None = None,
                   repeat_fraction: float | None = None) -> tuple[np.ndarray, np.ndarray]:
        """The next ``(x, y)``, each (B, T); ``seq_len``/``batch_size``/``repeat_fraction`` override T, B
        and r for this batch."""
        B = self.batch_size if batch_size is None else int(batch_size)
        T = self.seq_len if seq_len is None else int(seq_len)
        r = self.repeat_fraction if repeat_fraction is None else float(repeat_fraction)
        if not 1 <= T <= len(self.ids) - 1 or B < 1:
            raise ValueError(f"cannot draw {B} windows of {T} tokens from {len(self.ids)} tokens")
        if not 0.0 <= r <= 1.0:
            raise ValueError(f"repeat_fraction must be between 0 and 1, got {r!r}")
        if r > 0 and self.repeat_tokens == "random" and self._types is None:
            self._types = _distinct(self.ids)
        offsets = np.arange(T + 1)                                                # (T+1,)
        starts = self.rng.integers(0, len(self.ids) - T, size=B)                  # (B,)
        if self.doc_start_fraction > 0:
            at_doc = self.rng.random(B) < self.doc_start_fraction                 # (B,)
            usable = int(np.searchsorted(self.doc_starts, len(self.ids) - T))    # starts with T+1 ids after them
            pick = self.rng.integers(0, max(usable, 1), size=B)                   # (B,)
            if usable:
                starts = np.where(at_doc, self.doc_starts[pick], starts)
        index = starts[:, None] + offsets                                         # (B, T+1)
        if r > 0:
            repeat = self.rng.random(B)[:, None] < r                              # (B, 1)
            shortest, longest = -(-(T + 1) // 8), -(-(T + 1) // 2)               # h: ceil((T+1)/8) .. ceil((T+1)/2)
            period = self.rng.integers(shortest, longest + 1, size=B)             # (B,)
            cycle = offsets % period[:, None]                                     # (B, T+1): 0 .. h-1, 0 ..
            if self.repeat_tokens == "text":
                index = np.where(repeat, starts[:, None] + cycle, index)          # text at s, over and over
        rows = np.asarray(self.ids[index], dtype=np.int64)                        # (B, T+1)
        if r > 0 and self.repeat_tokens == "random":
            drawn = self._types[self.rng.integers(0, len(self._types), size=(B, T + 1))]  # (B, T+1) ids
            rows = np.where(repeat, np.take_along_axis(drawn, cycle, axis=1), rows)  # the first h, over and over
        self.batches += 1
        return rows[:, :-1], rows[:, 1:]                                     # (B, T), (B, T)

    def state(self) -> dict:
        return {"bit_generator": self.rng.bit_generator.state, "batches": self.batches}

    def set_state(self, state: dict) -> None:
        try:
            self.rng.bit_generator.state = state["bit_generator"]
            self.batches = int(state["batches"])
        except (KeyError, TypeError, ValueError) as e:
            raise ValueError(f"bad data sampler state: {e}") from None


# ----------------------------------------------------------------------------
# Stories that ship with glassllm
# ----------------------------------------------------------------------------

ASSETS = Path(__file__).parent / "assets"
# --data spec -> the compressed file in the package
SHIPPED_SOURCES = {"glassllm:stories": ASSETS / "stories.txt.xz",
                   "glassllm:stories-heldout": ASSETS / "stories-heldout.txt.xz"}
DEFAULT_TRAIN, DEFAULT_VALID = "glassllm:stories", "glassllm:stories-heldout"   # train's --data, --valid


def shipped_source(spec) -> Path | None:
    """The package's compressed file when a ``--data`` spec names shipped stories; None otherwise."""
    return SHIPPED_SOURCES.get(str(spec))


def shipped_text(spec, folder) -> Path:
    """The shipped stories ``spec`` as a text file in ``folder`` (decompressed once, atomically)."""
    source = shipped_source(spec)
    if source is None:
        raise ValueError(f"{spec!r} is not a story file that ships with glassllm; expected one of "
                         f"{', '.join(SHIPPED_SOURCES)}")
    if not source.is_file():
        raise ValueError(f"{spec}: {str(source)!r} is missing from this installation of glassllm")
    target = make_folder(folder) / source.name.removesuffix(".xz")
    if not target.is_file() or target.stat().st_mtime < source.stat().st_mtime:
        try:
            data = lzma.decompress(read_file(source))
        except lzma.LZMAError as e:
            raise ValueError(f"{spec}: {str(source)!r} cannot be decompressed ({e})") from None
        with atomic_path(target) as tmp:
            tmp.write_bytes(data)
    return target


# ----------------------------------------------------------------------------
# The Hugging Face hub
# ----------------------------------------------------------------------------

# alias -> (dataset repo, file)
HUB_SOURCES = {
    "tinystories:train": ("roneneldan/TinyStories", "TinyStoriesV2-GPT4-train.txt"),
    "tinystories:valid": ("roneneldan/TinyStories", "TinyStoriesV2-GPT4-valid.txt"),
    "tinystories-v1:train": ("roneneldan/TinyStories", "TinyStories-train.txt"),
    "tinystories-v1:valid": ("roneneldan/TinyStories", "TinyStories-valid.txt"),
}
_HF_SPEC = re.compile(r"^hf:([\w.-]+/[\w.-]+)/(.+)$")


def hub_url(repo: str, filename: str, revision: str = "main", endpoint: str | None = None) -> str:
    """``{endpoint}/datasets/{repo}/resolve/{revision}/{filename}`` (the hub's download URL)."""
    endpoint = (endpoint or os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")
    return (f"{endpoint}/datasets/{repo}/resolve/{urllib.parse.quote(revision, safe='')}/"
            f"{urllib.parse.quote(filename)}")


def fetch_hub_file(repo: str, filename: str, dest_dir, revision: str = "main", endpoint: str | None = None,
                   timeout: float = 60.0, progress: bool = True) -> Path:
    """Download one file of a hub dataset into ``dest_dir`` (once) and return its path.

    The file lands at ``dest_dir/datasets--{owner}--{name}/{revision}/{filename}``.
    Raises ValueError on any network or integrity problem, naming the URL.
    """
    pieces = filename.split("/")                                         # "" for a leading or doubled "/"
    if "" in pieces or ".." in pieces:
        raise ValueError(f"hub file name {filename!r} must be a relative path inside the dataset, without '..'")
    target = Path(dest_dir) / f"datasets--{repo.replace('/', '--')}" / revision / filename
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    url = hub_url(repo, filename, revision, endpoint)
    request = urllib.request.Request(url, headers={"User-Agent": "glassllm"})
    try:
        with urllib.request.urlopen(request, timeout=timeout) as response:
            expected_size = response.headers.get("Content-Length")
            etag = (response.headers.get("X-Linked-Etag") or response.headers.get("ETag") or "")
            etag = etag.removeprefix("W/").strip('"').lower()
            h, size = hashlib.sha256(), 0
            bar = _progress_bar(int(expected_size) if expected_size else None, filename, progress)
            with atomic_path(target) as tmp:
                with open(tmp, "wb") as f:
                    while True:
                        try:
                            chunk = response.read(1 << 20)
                        except (OSError, http.client.HTTPException) as e:    # the network, not the disk
                            raise ValueError(f"cannot download {url}: {e or type(e).__name__}") from None
                        if not chunk:
                            break
                        f.write(chunk)
                        h.update(chunk)
                        size += len(chunk)
                        bar.update(len(chunk))
                bar.close()
                if expected_size is not None and size != int(expected_size):
                    raise ValueError(f"download of {url} was cut short: got {size} of {expected_size} bytes")
                if re.fullmatch(r"[0-9a-f]{64}", etag) and h.hexdigest() != etag:
                    raise ValueError(f"download of {url} is corrupt: SHA-256 {h.hexdigest()} != ETag {etag}")
    except urllib.error.HTTPError as e:
        raise ValueError(f"cannot download {url}: HTTP {e.code} {e.reason}") from None
    except (urllib.error.URLError, OSError) as e:
        reason = getattr(e, "reason", None) or e
        raise ValueError(f"cannot download {url}: {reason}") from None
    return target


def _progress_bar(total, name, enabled):
    tqdm = require("tqdm", "a download's progress bar").tqdm
    return tqdm(total=total, desc=f"download {name}", unit="B", unit_scale=True, disable=not enabled)


def resolve_sources(specs, cache_dir=None, endpoint: str | None = None, progress: bool = True) -> list[Path]:
    """Turn ``--data`` arguments into local files, fetching hub sources first.

    A spec is a local file or folder, stories that ship with glassllm (:data:`SHIPPED_SOURCES`:
    ``glassllm:stories``), an alias from :data:`HUB_SOURCES` (``tinystories:train`` ...) or
    ``hf:OWNER/NAME/FILE`` (a file of any hub dataset).
    """
    specs = one_or_many(specs)
    cache = Path(cache_dir or default_cache_dir())
    local = []
    for spec in specs:
        hub = hub_source(spec)
        if shipped_source(spec) is not None:
            local.append(shipped_text(spec, cache / "shipped"))
        else:
            local.append(Path(spec) if hub is None else
                         fetch_hub_file(*hub, cache / "hub", endpoint=endpoint, progress=progress))
    return expand_paths(local)


def hub_source(spec) -> tuple[str, str] | None:
    """``(repo, filename)`` when a ``--data`` spec names a hub file (an alias of :data:`HUB_SOURCES`, or
    ``hf:OWNER/NAME/FILE``); None for a local path."""
    text = str(spec)
    if text in HUB_SOURCES:
        return HUB_SOURCES[text]
    match = _HF_SPEC.match(text)
    return None if match is None else match.groups()
