"""glassllm's PyTorch twin (the optional extra ``pip install "glassllm-numpy[torch]"``).

The same decoder as :mod:`glassllm.nn` -- same architecture, same parameter
names, same model file -- written with PyTorch so that it can train a bigger
model on GPUs and across machines (``torchrun ... -m glassllm.torch.train_ddp``);
the result then opens in the glass box (``glassllm inspect``, the tracer).

- :mod:`glassllm.torch.model`: :class:`Transformer`, :func:`from_glassllm`,
  :func:`to_glassllm`, :func:`load_model`, :func:`save_model`;
- :mod:`glassllm.torch.train_ddp`: the DistributedDataParallel trainer.
"""

__all__ = ["Transformer", "from_glassllm", "to_glassllm", "load_model", "save_model"]


def __getattr__(name: str):
    """The names of :mod:`glassllm.torch.model`, imported when first used: without PyTorch, a
    :class:`~glassllm.optional.MissingExtra` naming the extra (and ``python -m glassllm.torch.train_ddp``
    can say so in one line, since this package loads without it)."""
    if name not in __all__:
        raise AttributeError(f"module 'glassllm.torch' has no attribute {name!r}")
    from . import model                          # which asks for the real PyTorch, naming the extra if missing

    return getattr(model, name)
