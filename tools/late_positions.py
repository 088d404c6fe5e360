"""Does a model use the context past position 256, or only cope with it? Two checks on held-out stories.

Run from the repository root::

    python -m tools.late_positions [MODEL] [--valid ../shared/data/tinystories/valid.txt]

(MODEL defaults to the bundled model.) Each held-out story is read alone from the model's
document-start token, as ``glassllm eval --per-document`` reads it. For the stories whose
predictions reach input position 256 it prints

1. their loss at positions 0-255 beside their loss at 256-383: the same stories, so a difference is
   the positions', not the longer stories' (only the longer stories reach the late bands);
2. the loss of the predictions at positions 256-383 made with the story from its start in view,
   beside the same tokens predicted from the start token and only the previous W tokens
   (W = 128, 192), where every position stays below 256. A model that uses its late context does
   better with the whole story in view.
"""

from __future__ import annotations

import argparse
import sys

import numpy as np

from tools.specimen_report import VALID


def nats(model, ids) -> np.ndarray:
    """Nats of each next token of ``ids`` (one sequence), in float64."""
    from glassllm.autograd import no_grad
    from glassllm.train.evaluate import token_nats

    with no_grad():
        return token_nats(model, np.asarray(ids)[None, :-1], np.asarray(ids)[None, 1:])[0]


def late_positions(path, valid=VALID, first: int = 256, last: int = 383, windows=(128, 192)) -> dict:
    from glassllm.checkpoint import bundled_model_path, load_model
    from glassllm.train.evaluate import document_ids

    model, tok, _ = load_model(path or bundled_model_path())
    context = model.config.max_seq_len
    docs = [d[:context + 1] for d in document_ids(tok, [str(valid)]) if len(d) - 1 > first]
    whole = [nats(model, d) for d in docs]
    early = np.concatenate([w[:first] for w in whole])
    late = np.concatenate([w[first:last + 1] for w in whole])
    short = {}
    for width in windows:
        parts = []
        for d in docs:
            hi = min(last + 1, len(d) - 1)                  # the last target, d[hi], is predicted at position hi - 1
            seg = np.concatenate([d[:1], d[first - width:hi + 1]])
            parts.append(nats(model, seg)[width + 1:])      # the targets d[first + 1 .. hi], as whole[first:last + 1]
        short[width] = float(np.concatenate(parts).mean())
    return {"stories": len(docs), "early": float(early.mean()), "late": float(late.mean()), "short": short,
            "first": first, "last": last}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=None, help="model file (default: the bundled model)")
    parser.add_argument("--valid", default=str(VALID), help="held-out story file (default: %(default)s)")
    args = parser.parse_args(argv)
    r = late_positions(args.model, args.valid)
    a, b = r["first"], r["last"]
    print(f"{r['stories']} stories reach position {a}: loss at 0-{a - 1} {r['early']:.4f}, at {a}-{b} "
          f"{r['late']:.4f} ({r['late'] / r['early'] - 1:+.1%})")
    for width, loss in r["short"].items():
        print(f"positions {a}-{b} predicted from the start token and the previous {width} tokens only: {loss:.4f} "
              f"(with the whole story in view: {r['late']:.4f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
