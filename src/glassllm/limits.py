"""What a file or a command may claim, stated once, each limit with the reason for it.

A model file, a Hugging Face folder, a GGUF, a llama2.c checkpoint, a tokenizer, a training
state or a trace says how large it is: how many layers, how wide, how many tensors, how long its
strings and lists are. Every reader checks those claims against this table *before* it builds
anything from them, and checks that the sizes a file claims fit the bytes the file really has
(:func:`check_fits`), so that a crafted file of a few kilobytes is refused at once instead of
making the reader loop or allocate gigabytes. Every refusal is one ``ValueError`` line naming the
value, the limit and the file.

The limits are far above any model glassllm is meant to hold (the largest open Llama, 3.1 405B,
has 126 layers, 128 heads, width 16,384 and a context of 131,072) and far below what would
exhaust a machine. ``docs/reliability.md`` shows this table (:func:`markdown_table`).

Every JSON document glassllm reads -- a model file's header and metadata, ``config.json``,
``tokenizer.json``, ``tokenizer_config.json``, a safetensors index, a trace manifest, a training
state's records -- goes through :func:`parse_json`, which bounds its size and nesting before the
parser sees it, so no document can end in ``RecursionError``.

>>> LIMITS["layers"].value
1024
>>> parse_json("[" * 100_000, "config.json")
Traceback (most recent call last):
    ...
ValueError: config.json is not valid JSON: nested more than 64 deep
>>> check_count("n_layers", 10**7, "layers", "model.bin")
Traceback (most recent call last):
    ...
ValueError: model.bin: n_layers=10000000 is over the limit of 1,024 layers

This module imports nothing from glassllm but :mod:`glassllm.checks`.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass

from .checks import is_int

__all__ = ["Limit", "LIMITS", "limit", "over_limit", "check_count", "check_fits", "parse_json", "expect", "markdown_table",
           "MAX_JSON_BYTES", "MAX_JSON_DEPTH"]


@dataclass(frozen=True)
class Limit:
    """One limit: what it bounds (``what``, plural, for messages), its ``value`` and why."""

    what: str
    value: int
    reason: str


LIMITS: dict[str, Limit] = {
    "layers": Limit("layers", 1024,
                    "the largest open Llama has 126; every layer is a loop the reader and the model run"),
    "heads": Limit("heads", 1024, "the largest open Llama has 128 query heads"),
    "width": Limit("widths", 1 << 16,
                   "model width (and head size) of the largest open Llama: 16,384; four times that"),
    "ffn": Limit("MLP widths", 1 << 18, "the largest open Llama's MLP is 53,248 wide; about five times that"),
    "vocabulary": Limit("ids", 1 << 16, "token ids are stored as uint16 (training data, traces)"),
    "context": Limit("positions", 1 << 17,
                     "Llama 3.1's context; the rotary tables are built for every position when a model loads"),
    "tensors": Limit("tensors", 16_384, "a model of 1,024 layers has 9,219 tensors"),
    "metadata": Limit("metadata keys", 16_384, "a GGUF's header: llama.cpp's converters write a few dozen keys "
                                               "(a vocabulary is one key)"),
    "dims": Limit("dimensions", 8, "a weight has 1 or 2; a trace's snapshots at most 4"),
    "string": Limit("bytes", 1 << 20, "one string in a file (a token's piece, a metadata value); "
                                      "documents are bounded by their size below"),
    "array": Limit("items", 1 << 22, "one list in a file (a vocabulary, merges, token scores): "
                                     "4 times the largest tokenizer's merges"),
    "json_bytes": Limit("bytes", 64 << 20, "one JSON document (the largest tokenizer.json is about 17 MB)"),
    "json_depth": Limit("levels", 64, "the deepest document glassllm reads (a tokenizer.json) nests 6 levels; "
                                      "deeper ones would exhaust the parser's stack"),
    "header_bytes": Limit("bytes", 16 << 20, "a safetensors header: a model's is a few KB, a sharded model's "
                                             "index a few MB"),
    "timeline_points": Limit("points", 10_000, "each point traces the probe prompt once; 10,000 is far more "
                                               "steps than a plot can show"),
    "threads": Limit("threads", 1024, "threads beyond the machine's cores only add overhead"),
}

MAX_JSON_BYTES = LIMITS["json_bytes"].value
MAX_JSON_DEPTH = LIMITS["json_depth"].value


def limit(name: str) -> int:
    """The value of limit ``name`` (a key of :data:`LIMITS`)."""
    return LIMITS[name].value


def over_limit(value, name: str) -> str | None:
    """``"=N is over the limit of 1,024 layers"`` if the integer ``value`` exceeds limit ``name``, else None."""
    lim = LIMITS[name]
    if is_int(value) and value > lim.value:
        shown = f"an int of {len(str(value))} digits" if value > 10**30 else str(value)
        return f"={shown} is over the limit of {lim.value:,} {lim.what}"
    return None


def check_count(key: str, value, name: str, where: str = "") -> None:
    """Refuse ``value`` (the count a file or option calls ``key``) above limit ``name``: one line."""
    problem = over_limit(value, name)
    if problem:
        raise ValueError(f"{where + ': ' if where else ''}{key}{problem}")


def check_fits(claimed: int, available: int, what: str, where: str) -> None:
    """Refuse a file whose claims need ``claimed`` bytes when it holds ``available``: one line."""
    if claimed > available:
        raise ValueError(f"{where}: {what} need {claimed:,} bytes but the file holds {available:,}; "
                         "expected a complete file")


# One JSON string (escapes included): what the depth count skips over.
_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.S)
_NOT_BRACKETS = bytes(b for b in range(256) if b not in b"[]{}")


def json_depth(raw: bytes) -> int:
    """How deep the lists and objects of the JSON text ``raw`` nest (brackets in strings do not count)."""
    import numpy as np

    brackets = _JSON_STRING.sub(b'""', raw).translate(None, _NOT_BRACKETS)
    if not brackets:
        return 0
    steps = np.frombuffer(brackets, dtype=np.uint8)
    return int(np.cumsum(np.where((steps == ord("[")) | (steps == ord("{")), 1, -1)).max())


def parse_json(text, what: str, max_bytes: int = MAX_JSON_BYTES, max_depth: int = MAX_JSON_DEPTH):
    """The JSON value of ``text`` (str or UTF-8 bytes, a byte-order mark allowed), its size and nesting
    bounded first; anything else is one ``ValueError`` line that names ``what`` (a file, a field)."""
    if isinstance(text, str):
        raw = text.encode("utf-8", "surrogatepass")
    elif isinstance(text, (bytes, bytearray, memoryview)):
        raw = bytes(text)
    else:
        raise TypeError(f"{what} must be JSON text (str or bytes), got {type(text).__name__}")
    if len(raw) > max_bytes:
        raise ValueError(f"{what} is {len(raw):,} bytes, over the limit of {max_bytes:,} for a JSON document")
    if json_depth(raw) > max_depth:
        raise ValueError(f"{what} is not valid JSON: nested more than {max_depth} deep")
    try:
        decoded = raw.decode("utf-8-sig") if not isinstance(text, str) else text
    except UnicodeDecodeError:
        raise ValueError(f"{what} is not UTF-8 text") from None
    try:
        return json.loads(decoded)
    except json.JSONDecodeError as e:
        raise ValueError(f"{what} is not valid JSON ({e.msg} at line {e.lineno})") from None
    except (ValueError, RecursionError) as e:         # an integer of too many digits; a depth the scan missed
        raise ValueError(f"{what} is not valid JSON ({' '.join(str(e).split())[:80]})") from None


_TYPE_NAMES = {dict: "an object", list: "a list", str: "a string", int: "an integer", float: "a number",
               bool: "true or false"}


def expect(value, kind, what: str):
    """``value`` if it is of type ``kind`` (or a tuple of types; a bool is never an int), else one
    ``ValueError`` line naming ``what`` and the type expected."""
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = isinstance(value, kinds) and not (isinstance(value, bool) and bool not in kinds)
    if not ok:
        expected = " or ".join(_TYPE_NAMES.get(k, k.__name__) for k in kinds)
        got = _TYPE_NAMES.get(type(value), type(value).__name__)
        raise ValueError(f"{what} must be {expected}, got {got}")
    return value


def markdown_table() -> str:
    """The table of :data:`LIMITS` as ``docs/reliability.md`` shows it."""
    rows = ["| limit | value | why |", "|---|---:|---|"]
    rows += [f"| {name.replace('_', ' ')} | {lim.value:,} {lim.what} | {lim.reason} |" for name, lim in LIMITS.items()]
    return "\n".join(rows) + "\n"
