"""The one tokenizer interface every glassllm tool uses, and reading any tokenizer document.

glassllm has two tokenizers:

- :class:`glassllm.tokenizer.Tokenizer`, the byte-level BPE glassllm trains
  (kind ``"byte-bpe"``): 256 bytes, merges, then ``<|endoftext|>``;
- :class:`glassllm.sptokenizer.SPTokenizer`, a SentencePiece BPE as Llama 2,
  llama2.c and most GGUF Llamas use (kind ``"sentencepiece-bpe"``): character
  pieces, ``<0xNN>`` byte fallback, ``<unk> <s> </s>``.

Generation, the tracer, the inspector, evaluation and the CLI only use what
:class:`TextTokenizer` promises, so they work with either:

==========================  =================================================
``vocab_size``              number of ids
``encode(text, allowed)``   the ids of ``text`` (special tokens only where allowed)
``encode_prompt(text)``     what the *model* reads for ``text``: the model's
                            begin-of-text rule applied (``<s>`` first for a
                            SentencePiece Llama; nothing for glassllm's own),
                            special tokens in the text allowed
``encode_corpus(paths)``    a whole corpus as a uint16 array, documents
                            separated the model's way (for ``glassllm eval``)
``token_bytes(id, after)``  the bytes ``id`` adds to the text when it follows
                            the id ``after`` (None: at the start)
``decode_bytes / decode``   the bytes / text of a list of ids
``piece / pieces``          readable text of ids, for display
``special_tokens``          name -> id
``bos_id``                  the id put before every text, or None
``end_ids``                 the ids that end generation
``eot_id``                  the main end-of-text id (``ValueError`` if none)
``to_json()``               the document stored in a model file
==========================  =================================================

Documents carry a ``kind`` field; a document without one is a byte-level
tokenizer (files written before SentencePiece support load unchanged).
"""

from __future__ import annotations

from .limits import parse_json

from .sptokenizer import SPTokenizer
from .texttokenizer import KINDS, TextTokenizer, read_tokenizer_file
from .tokenizer import Tokenizer

__all__ = ["TextTokenizer", "tokenizer_from_json", "load_tokenizer", "KINDS"]

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
