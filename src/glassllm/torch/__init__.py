"""glassllm's PyTorch twin (the optional extra ``pip install "glassllm-numpy[torch]"``).

The same decoder as :mod:`glassllm.nn` -- same architecture, same parameter
names, same model file -- written with PyTorch so that it can train a bigger
model on GPUs and across machines (``torchrun ... -m glassllm.torch.train_ddp``);
the result then opens in the glass box (``glassllm inspect``, the tracer).

- :mod:`glassllm.torch.model`: :class:`Transformer`, :func:`from_glassllm`,
  :func:`to_glassllm`, :func:`load_model`, :func:`save_model`;
- :mod:`glassllm.torch.train_ddp`: the DistributedDataParallel trainer.
"""

import sys

from ..optional import MissingExtra, require

try:
    require("torch", "glassllm.torch")           # the real PyTorch (imports here are absolute)
except MissingExtra as e:
    if sys.argv[:1] == ["-m"]:                   # python -m glassllm.torch.train_ddp (or torchrun -m): a command
        print(f"glassllm.torch: error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
    raise

from .model import Transformer, from_glassllm, load_model, save_model, to_glassllm

__all__ = ["Transformer", "from_glassllm", "to_glassllm", "load_model", "save_model"]
