"""``glassllm eval``: held-out loss, perplexity and bits per byte of a model (:mod:`glassllm.train.evaluate`)."""

from __future__ import annotations

import dataclasses
import json

from ..checks import ParameterError, is_int
from ..data import resolve_sources
from ..limits import parse_json
from ..train import blas_threads, evaluate_text
from ..train.evaluate import REFERENCE, evaluate_documents
from . import load_model_option

__all__ = ["add_cli", "run", "trained_seq_len"]


def add_cli(name: str, parser) -> None:
    parser.description = (
        "Held-out loss, perplexity and bits per byte of a model on text. The text is encoded with the model's "
        "tokenizer and read from the model's document-start token (<s>, or <|endoftext|> and a newline). "
        "By default it is cut into non-overlapping windows of --seq-len tokens, every token after the start "
        "predicted once; with --per-document each document (story) is scored alone from its start token up to "
        "the model's context, and the loss is also given for positions 0-127, 128-255, 256-383 and 384-511. "
        "loss = nats per predicted token (the end of each story is predicted too), perplexity = exp(loss), "
        "bits/byte = total nats / (ln 2 x the UTF-8 bytes of the documents' text). Counted bytes are the "
        "stories' own, the same way for every tokenizer: separators between stories (the lines "
        "'\\n<|endoftext|>\\n', <s>, </s>) count 0 bytes.")
    parser.add_argument("--model", metavar="FILE", help="model file (default, or 'bundled': the bundled TinyStories model)")
    parser.add_argument("--data", nargs="+", metavar="PATH", required=True,
                        help="text files or folders to evaluate on (same forms as train --data)")
    parser.add_argument("--per-document", action="store_true",
                        help="score each document alone from its start token, with the loss by position band; "
                             "a band past position 255 is also compared with the loss at positions 0-255 of the "
                             "same documents (only the longer documents reach it)")
    parser.add_argument("--seq-len", type=int, default=None,
                        help="window length in tokens (default: the length the model was trained on, from its "
                             "file, or else its context: an imported model's training context); with "
                             "--per-document the longest stretch of a document scored (default: the model's "
                             "context)")
    parser.add_argument("--batch-size", type=int, default=16, help="windows per forward pass (default: 16)")
    parser.add_argument("--threads", type=int, metavar="N", help="BLAS threads (default: the library's choice)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    parser.set_defaults(func=run)


def trained_seq_len(meta: dict, context: int) -> int:
    """The window length a model file says it was trained on (its ``train_config``); else ``context``
    (an imported model's context is the one it was trained with, as its file says); at most ``context``."""
    try:
        trained = parse_json(meta.get("train_config", "{}"), "the model file's train_config").get("seq_len")
    except (ValueError, AttributeError):
        trained = None
    ok = is_int(trained) and trained >= 1
    return min(trained if ok else context, context)


def run(args) -> int:
    model, tokenizer, meta = load_model_option(args.model)
    files = [str(f) for f in resolve_sources(args.data, progress=False)]
    if args.per_document:
        context = args.seq_len if args.seq_len is not None else model.config.max_seq_len
        if not 1 <= context <= model.config.max_seq_len:
            raise ValueError(f"--seq-len must be in [1, {model.config.max_seq_len}] (the model's context), "
                             f"got {context}")
        with blas_threads(args.threads):
            try:
                result = evaluate_documents(model, tokenizer, files, context, args.batch_size)
            except ParameterError as e:                       # the context is --seq-len here
                if e.param != "context":
                    raise
                raise ParameterError("seq_len", e.problem) from None
        if args.json:
            doc = dataclasses.asdict(result)
            doc["bands"] = [{"first": lo, "last": hi, "tokens": n, "loss": None if n == 0 else loss}
                            for lo, hi, n, loss in result.bands]
            doc["same_documents"] = [{"first": lo, "last": hi, "documents": k, "reference": list(REFERENCE),
                                      "loss": None if k == 0 else loss}
                                     for lo, hi, k, loss in result.same_documents]
            print(json.dumps(doc))
        else:
            print(result.line())
            print("\n".join(result.band_lines()))
        return 0
    seq_len = args.seq_len if args.seq_len is not None else trained_seq_len(meta, model.config.max_seq_len)
    with blas_threads(args.threads):
        result = evaluate_text(model, tokenizer, files, seq_len, args.batch_size, from_start=True)
    if args.json:
        print(json.dumps({**dataclasses.asdict(result), "seq_len": seq_len}))
    else:
        print(f"{result.line()}  [{seq_len}-token windows]")                # the loss depends on the length
    return 0
