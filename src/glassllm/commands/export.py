"""``glassllm export FILE --format hf DIR``: write a model file as a Hugging Face Llama folder (:mod:`glassllm.interop.hf`)."""

from __future__ import annotations

from ..interop.hf import export_hf
from . import model_file

__all__ = ["add_cli", "run"]


def add_cli(name: str, parser) -> None:
    parser.add_argument("file", metavar="FILE", help="a glassllm model file ('bundled': the bundled model)")
    parser.add_argument("--format", choices=["hf"], default="hf",
                        help="target format: hf = a Hugging Face transformers Llama folder (default)")
    parser.add_argument("dir", metavar="DIR", help="the folder to write")
    parser.set_defaults(func=run)


def run(args) -> int:
    out = export_hf(model_file(args.file), args.dir)
    print(f"wrote a Hugging Face Llama folder to {out}/ (config.json, model.safetensors, tokenizer.json, "
          "tokenizer_config.json, generation_config.json)")
    return 0
