"""The tokenizer interface under its older name: :mod:`glassllm.tokenizers.base`, with the document
readers of :mod:`glassllm.tokenizers.document`."""

from .tokenizers.base import KINDS, TextTokenizer
from .tokenizers.document import parse_tokenizer_json, read_tokenizer_file

__all__ = ["TextTokenizer", "KINDS", "read_tokenizer_file", "parse_tokenizer_json"]
