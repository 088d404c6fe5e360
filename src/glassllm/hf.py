"""Hugging Face interop under its older name: :mod:`glassllm.interop.hf` (weights, config, folders),
with the ``tokenizer.json`` conversion of :mod:`glassllm.tokenizers.hfjson`."""

from .interop.hf import (config_from_hf, export_hf, folder_tokenizer, from_hf_state, halves_to_interleaved, hf_config,
                         hf_names, import_hf, interleaved_to_halves, load_hf, read_safetensors_dir, to_hf_state,
                         weight_files)
from .tokenizers.hfjson import byte_level_pattern, bytes_to_unicode, tokenizer_from_hf, tokenizer_to_hf

_bytes_to_unicode = bytes_to_unicode   # its name before it was public

__all__ = [
    "interleaved_to_halves", "halves_to_interleaved", "hf_config", "config_from_hf",
    "to_hf_state", "from_hf_state", "tokenizer_to_hf", "tokenizer_from_hf", "export_hf", "import_hf", "load_hf",
    "read_safetensors_dir", "hf_names", "weight_files", "folder_tokenizer", "byte_level_pattern", "bytes_to_unicode",
]
