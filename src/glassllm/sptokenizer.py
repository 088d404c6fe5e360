"""SentencePiece BPE under its older name: :mod:`glassllm.tokenizers.sentencepiece`."""

from .tokenizers.sentencepiece import (BYTE_PIECE, DOC_SEPARATOR, KIND, SPACE, TYPES, UNKNOWN_TEXT, SPTokenizer,
                                      load_sentencepiece_model)

__all__ = ["SPTokenizer", "SPACE", "TYPES", "KIND", "BYTE_PIECE", "load_sentencepiece_model", "DOC_SEPARATOR",
           "UNKNOWN_TEXT"]
