"""Reading a tokenizer of any kind, under its older name: :mod:`glassllm.tokenizers`."""

from .tokenizers import KINDS, SPTokenizer, TextTokenizer, Tokenizer, load_tokenizer, tokenizer_from_json

__all__ = ["TextTokenizer", "tokenizer_from_json", "load_tokenizer", "KINDS", "SPTokenizer", "Tokenizer"]
