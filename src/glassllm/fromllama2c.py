"""llama2.c files under their older module name: :mod:`glassllm.interop.llama2c`."""

from .interop.llama2c import MAGIC, read_llama2c, read_llama2c_tokenizer

__all__ = ["read_llama2c", "read_llama2c_tokenizer", "MAGIC"]
