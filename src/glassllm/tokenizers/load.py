"""A tokenizer document or file of any kind: its ``kind`` field says which tokenizer reads it.

Documents carry a ``kind`` field (:data:`~glassllm.tokenizers.base.KINDS`); a document without one
is a byte-level tokenizer (files written before SentencePiece support load unchanged).
"""


from __future__ import annotations

from ..limits import parse_json
from .base import KINDS, TextTokenizer
from .bpe import Tokenizer
from .document import read_tokenizer_file
from .sentencepiece import SPTokenizer

__all__ = ["tokenizer_from_json", "load_tokenizer"]


def tokenizer_from_json(text) -> TextTokenizer:
    """The tokenizer a document describes, by its ``kind`` (none: byte-level); ``ValueError`` if bad."""
    raw = text.decode("utf-8-sig", "replace") if isinstance(text, (bytes, bytearray)) else text
    kind = None
    if isinstance(raw, str):
        try:
            doc = parse_json(raw, "tokenizer document")
            kind = doc.get("kind") if isinstance(doc, dict) else None
        except ValueError:
            pass                                                # the byte-level reader names the problem
    if kind in (None, "byte-bpe"):
        return Tokenizer.from_json(text)
    if kind == "sentencepiece-bpe":
        return SPTokenizer.from_json(text)
    raise ValueError(f"tokenizer kind {kind!r} is not supported, expected one of {list(KINDS)}")


def load_tokenizer(path) -> TextTokenizer:
    """A tokenizer file of either kind; every problem is one ``ValueError`` naming the file."""
    return read_tokenizer_file(path, tokenizer_from_json)
