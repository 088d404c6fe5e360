"""The byte-level BPE under its older name: :mod:`glassllm.tokenizers.bpe` (the tokenizer), with the
corpus reading of :mod:`glassllm.tokenizers.corpus` and :mod:`glassllm.files`."""

from .files import folder_texts, is_path, text_files
from .tokenizers.base import CONTROL_ESCAPES
from .tokenizers.bpe import EOT, FORMAT, PATTERN, VERSION, WHITE_SPACE, Tokenizer, merge_pair
from .tokenizers.corpus import documents, read_blocks

__all__ = ["Tokenizer", "PATTERN", "FORMAT", "VERSION", "EOT", "merge_pair", "documents", "folder_texts", "text_files",
           "is_path", "read_blocks", "CONTROL_ESCAPES", "WHITE_SPACE"]
