"""``glassllm import SOURCE OUT`` (and ``import-hf``, its older name): a Llama you have as a model file
(:mod:`glassllm.interop.importer`)."""

from __future__ import annotations

import numpy as np

from ..interop.importer import import_model

__all__ = ["add_cli", "run"]


def add_cli(name: str, parser) -> None:
    if name == "import-hf":                      # the older name reads Hugging Face folders only
        parser.add_argument("source", metavar="PATH", help="a Hugging Face Llama folder (glassllm import also "
                            "reads .gguf files and llama2.c .bin checkpoints)")
    else:
        parser.add_argument("source", metavar="PATH", help="a Hugging Face Llama folder, a .gguf file, or a "
                            "llama2.c .bin (with tokenizer.bin beside it)")
    parser.add_argument("out", metavar="OUT", help="the glassllm model file to write")
    if name != "import-hf":
        parser.add_argument("--tokenizer", metavar="FILE", default=None,
                            help="llama2.c only: the tokenizer.bin (default: the one beside the .bin)")
    parser.add_argument("--dtype", choices=["float32", "float64"], default=None,
                        help="precision of the model file (default: float32; a Hugging Face folder of F64 "
                             "tensors stays float64)")
    parser.set_defaults(func=run)


def run(args) -> int:
    # import-hf, the older name, reads only Hugging Face folders (and says so of anything else).
    model, tok, kind, perm = import_model(args.source, args.out, dtype=args.dtype,
                                          tokenizer=getattr(args, "tokenizer", None),
                                          kind="hf" if args.command == "import-hf" else None)
    c = model.config
    what = {"hf": "Hugging Face folder", "gguf": "GGUF file", "llama2c": "llama2.c checkpoint"}[kind]
    print(f"wrote {args.out} from a {what}: {model.num_params():,} {np.dtype(model.dtype).name} parameters, "
          f"vocab {c.vocab_size} ({'SentencePiece' if tok.kind == 'sentencepiece-bpe' else 'byte-level'} BPE), "
          f"width {c.dim}, {c.n_layers} layer{'s' if c.n_layers != 1 else ''}, {c.n_heads} query heads / "
          f"{c.n_kv_heads} key-value head{'s' if c.n_kv_heads != 1 else ''}"
          f"{', output head tied to the embedding (stored once)' if c.tie_embeddings else ''}")
    if not np.array_equal(perm, np.arange(len(perm))):
        print("note: token ids were renumbered into glassllm's layout (bytes, merges, special tokens)")
    return 0
