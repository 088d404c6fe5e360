"""glassllm: a glass-box LLaMA-style language model in NumPy."""

__version__ = "0.1.0"
