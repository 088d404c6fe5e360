"""``glassllm tokenize``: train a tokenizer on text files, or show how one splits text (:mod:`glassllm.tokenizers`)."""

from __future__ import annotations

import sys
import time
from pathlib import Path

from .. import checkpoint
from ..files import read_head, refuse_to_replace, starts_like_safetensors
from ..tokenizers import TextTokenizer, Tokenizer, load_tokenizer, tokenizer_from_json
from ..tokenizers.document import FORMAT

__all__ = ["add_cli", "run", "tokenizer_from_file"]


def add_cli(name: str, parser) -> None:
    """Options of ``glassllm tokenize``: train a tokenizer, or show how one splits text."""
    parser.add_argument("text", nargs="?", metavar="TEXT", help="text to split into tokens (default: read stdin)")
    parser.add_argument("--tokenizer", metavar="FILE",
                        help="a tokenizer file, or a model file (default: the bundled model's tokenizer)")
    parser.add_argument("--train", nargs="+", metavar="PATH",
                        help="train a new tokenizer on these text files or folders")
    parser.add_argument("--vocab-size", type=int, default=None, metavar="N", help="ids in a new tokenizer (default: 1024)")
    parser.add_argument("--out", metavar="FILE", help="where --train writes the tokenizer")
    parser.set_defaults(func=run)


def run(args) -> int:
    if args.train:
        if not args.out:
            raise ValueError("--train needs --out FILE, the file to write the tokenizer to")
        if args.tokenizer or args.text is not None:
            raise ValueError("--train makes a new tokenizer: it takes no --tokenizer and no text to split")
        refuse_to_replace(args.out, "--out", "a glassllm tokenizer file",
                          lambda p: f'"{FORMAT}"'.encode() in read_head(p) and read_head(p).lstrip()[:1] == b"{",
                          inputs=args.train)
        start = time.perf_counter()
        tok = Tokenizer.train([Path(p) for p in args.train],
                              vocab_size=1024 if args.vocab_size is None else args.vocab_size)
        tok.save(args.out)
        print(f"trained {tok!r} in {time.perf_counter() - start:.1f} s; wrote {args.out}")
        return 0

    if args.out is not None:
        raise ValueError("--out applies only with --train (splitting text writes no file)")
    if args.vocab_size is not None:
        raise ValueError("--vocab-size applies only with --train (splitting text uses the tokenizer as it is)")
    tok = tokenizer_from_file(args.tokenizer)
    text = args.text if args.text is not None else sys.stdin.read()
    ids = tok.encode(text, allowed_special="all")
    width = len(str(tok.vocab_size - 1))
    for i in ids:
        print(f"{i:>{width}}  '{tok.piece(i)}'")  # quoted, so that a space piece shows; pieces are already readable
    size, n = len(text.encode("utf-8")), len(ids)
    print(f"{n:,} token{'s' * (n != 1)} for {size:,} byte{'s' * (size != 1)} ({size / max(n, 1):.2f} bytes/token)")
    return 0


def tokenizer_from_file(path) -> TextTokenizer:
    """A tokenizer file, or the tokenizer inside a model file (None: the bundled model's)."""
    if path is None:
        path = checkpoint.bundled_model_path()
        if not path.exists():
            raise ValueError("no bundled model in this installation; pass --tokenizer FILE")
    head = read_head(path, 9)
    # Anything but a model file is read as a tokenizer file, which names its own problems.
    if not starts_like_safetensors(head):
        return load_tokenizer(path)
    _, meta = checkpoint.read_header(path)
    try:
        return tokenizer_from_json(meta.get("tokenizer", ""))
    except ValueError as e:
        raise ValueError(f"{str(path)!r}: bad tokenizer: {e}") from None
