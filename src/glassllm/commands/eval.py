"""``glassllm eval``: held-out loss, perplexity and bits per byte of a model (:func:`glassllm.train.evaluate`)."""

from __future__ import annotations

import dataclasses
import json

from ..data import resolve_sources
from ..train import blas_threads, evaluate_text
from . import load_model_option

__all__ = ["add_cli", "run", "trained_seq_len"]


def add_cli(name: str, parser) -> None:
    parser.description = (
        "Held-out loss, perplexity and bits per byte of a model on text. The text is encoded with the model's "
        "tokenizer and cut into non-overlapping windows of --seq-len tokens; every token but the first is "
        "predicted once. loss = nats per predicted token, perplexity = exp(loss), bits/byte = total nats / "
        "(ln 2 x UTF-8 bytes of the predicted tokens' text).")
    parser.add_argument("--model", metavar="FILE", help="model file (default: the bundled TinyStories model)")
    parser.add_argument("--data", nargs="+", metavar="PATH", required=True,
                        help="text files or folders to evaluate on (same forms as train --data)")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="window length in tokens (default: the length the model was trained on, from its "
                             "file; else 256, or the model's context if shorter)")
    parser.add_argument("--batch-size", type=int, default=16, help="windows per forward pass (default: 16)")
    parser.add_argument("--threads", type=int, metavar="N", help="BLAS threads (default: the library's choice)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.set_defaults(func=run)


def trained_seq_len(meta: dict, context: int) -> int:
    """The window length a model file says it was trained on (its ``train_config``), else 256; at most ``context``."""
    try:
        trained = json.loads(meta.get("train_config", "{}")).get("seq_len")
    except (ValueError, AttributeError):
        trained = None
    ok = isinstance(trained, int) and not isinstance(trained, bool) and trained >= 1
    return min(trained if ok else 256, context)


def run(args) -> int:
    model, tokenizer, meta = load_model_option(args.model)
    seq_len = args.seq_len if args.seq_len is not None else trained_seq_len(meta, model.config.max_seq_len)
    files = resolve_sources(args.data, progress=False)
    with blas_threads(args.threads):
        result = evaluate_text(model, tokenizer, [str(f) for f in files], seq_len, args.batch_size)
    if args.json:
        print(json.dumps({**dataclasses.asdict(result), "seq_len": seq_len}))
    else:
        print(f"{result.line()}  [{seq_len}-token windows]")                # the loss depends on the length
    return 0
