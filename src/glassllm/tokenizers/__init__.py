"""glassllm's tokenizers: the one interface every tool uses, the two tokenizers, and their files.

glassllm has two tokenizers:

- :class:`~glassllm.tokenizers.bpe.Tokenizer`, the byte-level BPE glassllm trains
  (kind ``"byte-bpe"``): 256 bytes, merges, then ``<|endoftext|>``;
- :class:`~glassllm.tokenizers.sentencepiece.SPTokenizer`, a SentencePiece BPE as Llama 2,
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

One concept per module:

=====================  =====================================================
``base``               :class:`TextTokenizer`, the interface above
``bpe``                byte-level BPE (:class:`Tokenizer`): training, encoding
``sentencepiece``      SentencePiece BPE (:class:`SPTokenizer`), and reading
                       a SentencePiece ``.model`` file
``corpus``             reading a corpus: text and text files in blocks,
                       documents and stories
``document``           the glassllm tokenizer document (JSON) and its files
``load``               a document or file of either kind
                       (:func:`tokenizer_from_json`, :func:`load_tokenizer`)
``hfjson``             Hugging Face ``tokenizer.json`` for the byte-level BPE
``protobuf``           the protobuf wire format, enough for a ``.model`` file
=====================  =====================================================

Documents carry a ``kind`` field; a document without one is a byte-level
tokenizer (files written before SentencePiece support load unchanged).
"""

from __future__ import annotations

from .base import KINDS, TextTokenizer
from .bpe import EOT, Tokenizer
from .load import load_tokenizer, tokenizer_from_json
from .sentencepiece import SPTokenizer, load_sentencepiece_model

__all__ = ["TextTokenizer", "KINDS", "Tokenizer", "EOT", "SPTokenizer", "load_sentencepiece_model",
           "tokenizer_from_json", "load_tokenizer"]
