"""``glassllm generate PROMPT``: continue a text with a model, token by token (:mod:`glassllm.generate`)."""

from __future__ import annotations

import sys

from .. import generate as gen
from . import load_model_option

__all__ = ["add_cli", "run", "quoted"]


def quoted(piece: str) -> str:
    """A token piece in quotes, as Python quotes a str: ``'s`` is ``"'s"``, `` cat`` is ``' cat'``. Pieces are
    already readable (escapes for bytes and control characters), so nothing else is escaped.

    >>> print(quoted("'s"), quoted(" cat"), quoted(' "'))
    "'s" ' cat' ' "'
    """
    if "'" in piece and '"' not in piece:
        return f'"{piece}"'
    return "'" + piece.replace("'", "\\'") + "'"


def add_cli(name: str, parser) -> None:
    parser.add_argument("prompt", metavar="PROMPT", help="the text to continue ('<|endoftext|>' starts a fresh story)")
    parser.add_argument("--model", metavar="FILE", default=None,
                        help="model file (default, or 'bundled': the bundled TinyStories model)")
    parser.add_argument("--max-new-tokens", type=int, default=None, metavar="N",
                        help="stop after N new tokens (default: 200, or as many as the model's context has room for)")
    parser.add_argument("--temperature", type=float, default=1.0, metavar="T",
                        help="softmax temperature; 0 = greedy (default: 1.0)")
    parser.add_argument("--top-k", type=int, default=None, metavar="K",
                        help="keep the K most likely ids, 1..vocabulary (default: off)")
    parser.add_argument("--top-p", type=float, default=None, metavar="P",
                        help="then keep the smallest set of ids with mass >= P, 0 < P <= 1 (default: off)")
    parser.add_argument("--seed", type=int, default=0, metavar="S", help="random seed (default: 0)")
    parser.add_argument("--stop", action="append", default=None, metavar="STR",
                        help="stop once the new text contains STR (included); repeatable")
    parser.add_argument("--show-probs", action="store_true",
                        help="one line per token: its probability under the model and in the distribution it "
                             "was drawn from (after temperature, top-k, top-p), and the model's top alternatives")
    parser.set_defaults(func=run)


def run(args) -> int:
    model, tokenizer, _ = load_model_option(args.model)
    n_prompt = len(tokenizer.encode_prompt(args.prompt))                 # what the model reads for it
    max_new_tokens = args.max_new_tokens
    if max_new_tokens is None:                                           # the default fits the context
        max_new_tokens = max(1, min(200, model.config.max_seq_len - n_prompt))
    # Every option is checked by generate itself; a refused one is reported under its flag (glassllm.cli).
    records = gen.generate(model, tokenizer, args.prompt, max_new_tokens=max_new_tokens,
                           temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
                           seed=args.seed, stop=args.stop, alternatives=5 if args.show_probs else 0)
    out = sys.stdout
    if not args.show_probs:
        out.write(args.prompt)
        out.flush()
        try:
            for t in records:
                out.write(t.text)
                out.flush()
        finally:
            out.write("\n")  # the text's line ends, even when Ctrl+C cut it short
            out.flush()
        return 0
    out.write(f"prompt: {args.prompt!r} ({n_prompt} token{'s' if n_prompt != 1 else ''})\n")
    # p(model): the model's own probability (softmax of the logits); p(drawn): in the distribution the token
    # was drawn from (after --temperature, --top-k, --top-p). The alternatives are the model's most likely.
    out.write(f"{'step':>4} {'n':>3} {'m':>4}  {'id':>5}  {'token':<16} {'p(model)':>8} {'p(drawn)':>8}  "
              "top alternatives (p(model))\n")
    for t in records:
        alts = "  ".join(f"{quoted(tokenizer.piece(i))} {p:.3f}" for i, p in t.top if i != t.id)
        piece = quoted(t.piece)
        out.write(f"{t.step:>4} {t.n:>3} {t.m:>4}  {t.id:>5}  {piece:<16} {t.prob:>8.4f} {t.p_sampled:>8.4f}  {alts}\n")
        out.flush()
        if t.finish:
            out.write(f"[stopped: {t.finish}]\n")
    return 0
