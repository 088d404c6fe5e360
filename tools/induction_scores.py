"""Does a model have an induction head? The repeated-random-tokens test, for any model file.

Eight random sequences of N = 40 tokens (ids 256 .. 1022, seed 0), each followed by
itself -- the test of lesson 11 (docs/lessons/11-reading-heads.md). Prints the mean
loss on the first and on the second copy, and each head's induction score: its mean
attention weight, over the second copy, on the key right after the current token's
earlier occurrence (cell [i, i - N + 1]), against the chance level of a head that
spreads its weight evenly. Used to compare training runs (the bundled model's card
quotes it); run from the repository root::

    python -m tools.induction_scores runs/bundled/model.safetensors [more.safetensors ...]
"""

from __future__ import annotations

import argparse
import sys

import numpy as np


def induction_report(path, n: int = 40, rows: int = 8, seed: int = 0) -> dict:
    """{'first', 'second': mean losses; 'scores': (L, H) induction scores; 'best', 'layer', 'head': the
    highest score and where; 'chance'} for one model file."""
    from glassllm.autograd import no_grad
    from glassllm.checkpoint import load_model
    from glassllm.sampling import model_probs
    from glassllm.trace import trace

    model, _, _ = load_model(path)
    L, H = model.config.n_layers, model.config.n_heads
    first = np.random.default_rng(seed).integers(256, 1023, size=(rows, n))
    repeated = np.concatenate([first, first], axis=1)                     # (rows, 2n)
    with no_grad():
        logits = model(repeated[:, :-1]).data                             # (rows, 2n-1, V)
    p = model_probs(logits.reshape(-1, logits.shape[-1])).reshape(logits.shape)
    loss = -np.log(np.take_along_axis(p, repeated[:, 1:, None], axis=-1)[..., 0])   # (rows, 2n-1)
    scores = np.zeros((L, H))
    for row in repeated:
        t = trace(model, row, names="attn.softmax")
        i = np.arange(n, 2 * n)
        scores += np.array([[t.get("attn.softmax", layer=l, head=h)[i, i - n + 1].mean() for h in range(H)]
                            for l in range(L)]) / rows
    layer, head = np.unravel_index(scores.argmax(), scores.shape)
    return {"first": float(loss[:, :n - 1].mean()), "second": float(loss[:, n:].mean()), "scores": scores,
            "best": float(scores.max()), "layer": int(layer), "head": int(head),
            "chance": float(np.mean(1 / (np.arange(n, 2 * n) + 1)))}


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("models", nargs="+")
    args = parser.parse_args(argv)
    for path in args.models:
        r = induction_report(path)
        print(f"{path}: loss first copy {r['first']:.2f}, second copy {r['second']:.2f} nats/token; "
              f"best induction score {r['best']:.3f} (layer {r['layer']}, head {r['head']}; chance {r['chance']:.3f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
