"""Open a Llama you already have as a glassllm model file (``glassllm import SOURCE OUT``).

SOURCE is any of

- a Hugging Face Llama folder (``config.json``, safetensors weights, and a
  ``tokenizer.json`` -- glassllm's byte-level BPE or a SentencePiece BPE -- or
  a SentencePiece ``tokenizer.model``): :mod:`glassllm.interop.hf`;
- a ``.gguf`` file (F32, F16, BF16 or Q8_0 weights; a SentencePiece vocabulary):
  :mod:`glassllm.interop.gguf`;
- a llama2.c ``.bin`` (legacy or version 1) with its ``tokenizer.bin``:
  :mod:`glassllm.interop.llama2c`.

Anything glassllm's model cannot hold exactly (biases, RoPE scaling, another
architecture, another quantisation, a tokenizer it cannot reproduce) is refused
with one line naming the reason, before anything is written; the model file is
written atomically, so a failed import leaves no half file. ``import-hf`` is
the same command under its older name.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from ..checkpoint import is_model_file, save_model
from ..files import refuse_to_replace
from ..nn import Transformer, model_dtype

__all__ = ["load_source", "import_model", "source_kind", "build_model"]


def build_model(config, state: dict, where: str, dtype=None):
    """A :class:`~glassllm.nn.Transformer` from a full state dict, every name, shape and value checked."""
    shapes = config.param_shapes()
    for key in shapes:
        if key not in state:
            raise ValueError(f"{where}: missing tensor for {key!r}")
    for key, w in state.items():
        if key not in shapes:
            raise ValueError(f"{where}: unexpected tensor {key!r}; expected only Llama weights")
        if tuple(w.shape) != shapes[key]:
            raise ValueError(f"{where}: tensor for {key!r} has shape {tuple(w.shape)}, expected {shapes[key]}")
        if not np.all(np.isfinite(w)):
            raise ValueError(f"{where}: tensor for {key!r} contains NaN or infinite values")
    model = Transformer(config, dtype=model_dtype(dtype) if dtype is not None else np.float32, init=False)
    model.load_state_dict(state, copy=False)
    return model


def source_kind(source) -> str:
    """``"hf"``, ``"gguf"`` or ``"llama2c"``: what SOURCE is, by what it is and how it starts."""
    path = Path(source)
    if path.is_dir():
        return "hf"
    if not path.is_file():
        raise ValueError(f"{str(path)!r} does not exist; expected a Hugging Face folder, a .gguf file or a "
                         "llama2.c .bin")
    with open(path, "rb") as f:
        head = f.read(4)
    if head == b"GGUF" or path.suffix.lower() == ".gguf":
        return "gguf"
    if path.suffix.lower() == ".bin":
        return "llama2c"
    raise ValueError(f"{str(path)!r} is neither a folder, a .gguf file nor a .bin; expected a Hugging Face "
                     "folder, a GGUF file or a llama2.c checkpoint")


def load_source(source, dtype=None, tokenizer=None, kind=None):
    """``(model, tokenizer, kind, perm)`` of SOURCE (see the module docstring).

    ``tokenizer``: a llama2.c ``tokenizer.bin`` (default: the one beside the model).
    ``perm`` is the Hugging Face import's id renumbering (``arange(V)`` elsewhere).
    ``kind``: ``"hf"``, ``"gguf"`` or ``"llama2c"`` (default: :func:`source_kind`).
    """
    kind = kind or source_kind(source)
    if tokenizer is not None and kind != "llama2c":
        raise ValueError("--tokenizer applies to llama2.c checkpoints only (a folder or GGUF holds its own)")
    if kind == "hf":
        from .hf import load_hf

        model, tok, perm = load_hf(source, dtype)
        return model, tok, kind, perm
    if kind == "gguf":
        from .gguf import read_gguf

        config, state, tok = read_gguf(source)
    else:
        from .llama2c import read_llama2c

        config, state, tok = read_llama2c(source, tokenizer)
    if tok.vocab_size != config.vocab_size:
        raise ValueError(f"{str(source)!r}: the tokenizer has {tok.vocab_size} ids but the model {config.vocab_size}; "
                         "expected the model's own tokenizer")
    model = build_model(config, state, str(source), dtype)
    return model, tok, kind, np.arange(config.vocab_size)


def import_model(source, out_file, dtype=None, tokenizer=None, kind=None):
    """Write SOURCE as the glassllm model file ``out_file`` (atomically): ``(model, tokenizer, kind, perm)``."""
    out = Path(out_file)
    src = Path(source)
    if src.is_dir() and out.resolve().is_relative_to(src.resolve()):
        raise ValueError(f"cannot write {str(out)!r} into the checkpoint folder {str(src)!r} being read; "
                         "choose a file outside it")
    if src.is_file() and out.exists() and out.resolve() == src.resolve():
        raise ValueError(f"cannot write {str(out)!r} over the checkpoint being read; choose another file")
    refuse_to_replace(out, "the output", "a glassllm model file", is_model_file)
    model, tok, kind, perm = load_source(source, dtype, tokenizer, kind)
    save_model(out, model, tok, {"source": f"{kind}:{src.name}"})
    return model, tok, kind, perm
