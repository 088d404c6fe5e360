"""GGUF files under their older module name: :mod:`glassllm.interop.gguf`."""

from .interop.gguf import GGUF_NAMES, MAGIC, SUPPORTED, check_counts, read_gguf

__all__ = ["read_gguf", "GGUF_NAMES", "MAGIC", "SUPPORTED", "check_counts"]
