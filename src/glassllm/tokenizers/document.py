"""The glassllm tokenizer document: the JSON text a tokenizer file, or a model file's ``tokenizer``
field, holds (``"format": "glassllm-tokenizer"``; its fields are each tokenizer's, in
:mod:`glassllm.tokenizers.bpe` and :mod:`glassllm.tokenizers.sentencepiece`).

:func:`parse_tokenizer_json` reads the JSON, bounded (:func:`glassllm.limits.parse_json`);
:func:`read_tokenizer_file` reads a file of it, with every problem one ``ValueError`` line naming
the file.
"""

from __future__ import annotations

from pathlib import Path

from ..files import read_file
from ..limits import MAX_JSON_BYTES, parse_json

__all__ = ["FORMAT", "VERSION", "parse_tokenizer_json", "read_tokenizer_file"]

FORMAT = "glassllm-tokenizer"
VERSION = 1


def parse_tokenizer_json(text):
    """The JSON value of a tokenizer document given as text or UTF-8 bytes (a byte-order mark allowed);
    text that is not one is a ``ValueError`` line, anything but text or bytes a ``TypeError``."""
    if isinstance(text, (bytes, bytearray)):
        try:
            text = bytes(text).decode("utf-8-sig")
        except UnicodeDecodeError:
            raise ValueError("tokenizer document is not UTF-8 text") from None
    if not isinstance(text, str):
        raise TypeError(f"from_json expects a str, got {type(text).__name__}")
    return parse_json(text, "tokenizer document")


def read_tokenizer_file(path, parse):
    """``parse`` applied to the bytes of the tokenizer file ``path``; a missing or unreadable file, or
    one ``parse`` refuses, is one ``ValueError`` line naming the file."""
    if not Path(path).exists():
        raise ValueError(f"tokenizer file not found: {str(path)!r}")
    data = read_file(path, "tokenizer file", MAX_JSON_BYTES, "a JSON document")
    try:
        return parse(data)
    except ValueError as e:
        raise ValueError(f"{str(path)!r}: {e}") from None
