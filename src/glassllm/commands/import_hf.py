"""``glassllm import-hf DIR OUT``: a Hugging Face Llama folder as a glassllm model file (:mod:`glassllm.hf`)."""

from __future__ import annotations

import numpy as np

from ..hf import import_hf

__all__ = ["add_cli", "run"]


def add_cli(name: str, parser) -> None:
    parser.add_argument("dir", metavar="DIR", help="a Hugging Face Llama folder (config.json, "
                        "model.safetensors, tokenizer.json)")
    parser.add_argument("out", metavar="OUT", help="the glassllm model file to write")
    parser.add_argument("--dtype", choices=["float32", "float64"], default=None,
                        help="precision of the model file (default: the checkpoint's -- float64 if its "
                             "tensors are F64, else float32)")
    parser.set_defaults(func=run)


def run(args) -> int:
    model, tokenizer, perm = import_hf(args.dir, args.out, dtype=args.dtype)
    c = model.config
    print(f"wrote {args.out}: {model.num_params():,} {np.dtype(model.dtype).name} parameters, "
          f"vocab {c.vocab_size}, width {c.dim}, "
          f"{c.n_layers} layer{'s' if c.n_layers != 1 else ''}, {c.n_heads} query heads / "
          f"{c.n_kv_heads} key-value head{'s' if c.n_kv_heads != 1 else ''}")
    if not np.array_equal(perm, np.arange(len(perm))):
        print("note: token ids were renumbered into glassllm's layout (bytes, merges, special tokens)")
    return 0
