"""Every figure the bundled model's card quotes, measured on one model file.

Run from the repository root::

    python -m tools.specimen_report [MODEL] [--valid ../shared/data/tinystories/valid.txt] [--json]

(MODEL defaults to the bundled model.) It prints

1. held-out bits per byte by ``glassllm eval``'s count (the stories' own UTF-8 bytes), two ways:
   each story scored alone from the model's document-start token up to its context
   (``glassllm eval --per-document``), with the loss by position band (0-127, 128-255,
   256-383, 384-511; a late band also against the same stories' loss at 0-255), and over non-overlapping windows of the length the model was trained on;
2. how samples end: 15 samples of at most 150 new tokens (the five card prompts, seeds 0 and 1
   at temperature 0.8 / top-k 40, and greedy), the share that end with the end-of-text token
   before 150 and before 60 new tokens, and their median length in new tokens; and the same 15
   drawn until the story ends (at most the model's context), their median length in tokens
   (prompt included) beside the held-out stories' median length in tokens;
3. the share of repeated 4-grams in 200 greedy tokens after each prompt (no stop at the end of a
   story), as ``tools/finish_bundled.py`` measures it;
4. the repeated-random-tokens induction test of ``tools/induction_scores.py``.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

ROOT = Path(__file__).resolve().parents[1]

from tools.finish_bundled import PROMPTS, SEEDS, repetition  # noqa: E402
from tools.induction_scores import induction_report  # noqa: E402

# ../shared/data beside the repository (a git worktree may sit one folder deeper).
VALID = next((p / "shared" / "data" / "tinystories" / "valid.txt" for p in (ROOT.parent, ROOT.parent.parent)
              if (p / "shared" / "data" / "tinystories" / "valid.txt").is_file()),
             ROOT.parent / "shared" / "data" / "tinystories" / "valid.txt")
NEW_TOKENS = 150            # the card's sample length
EARLY = 60                  # a story that ends within this many new tokens ended early
SAMPLING = {"temperature": 0.8, "top_k": 40}


def sample_runs(model, tok, max_new_tokens: int | None) -> list[dict]:
    """The 15 card samples (prompt x (seed 0, seed 1, greedy)): new tokens drawn, whether the story ended,
    and its length in tokens with the prompt. ``max_new_tokens`` None: until the end of the context."""
    from glassllm.generate import generate

    runs = []
    for prompt in PROMPTS:
        n_prompt = len(tok.encode_prompt(prompt))
        limit = max_new_tokens or model.config.max_seq_len - n_prompt
        for kw in [dict(SAMPLING, seed=s) for s in SEEDS] + [dict(temperature=0.0)]:
            records = list(generate(model, tok, prompt, max_new_tokens=limit, **kw))
            ended = bool(records) and records[-1].finish == "eot"
            new = len(records) - ended                                     # the end-of-text record is no token
            runs.append({"prompt": prompt, "seed": kw.get("seed"), "new_tokens": new, "ended": ended,
                         "story_tokens": n_prompt - (tok.bos_id is not None) + new})
    return runs


def held_out_lengths(tok, valid) -> np.ndarray:
    """Each held-out story's length in tokens (its own text: no start token, separator or end)."""
    from glassllm.tokenizing import SPTokenizer

    text = Path(valid).read_text(encoding="utf-8")
    stories = [s.strip() if isinstance(tok, SPTokenizer) else s for s in text.split("\n<|endoftext|>\n")]
    return np.array([len(tok.encode(s)) for s in stories if s.strip()])


def report(path, valid=VALID) -> dict:
    from glassllm.checkpoint import bundled_model_path, load_model
    from glassllm.commands.eval import trained_seq_len
    from glassllm.train import evaluate_text
    from glassllm.train.evaluate import evaluate_documents

    path = Path(path) if path else bundled_model_path()
    model, tok, meta = load_model(path)
    docs = evaluate_documents(model, tok, [str(valid)])
    seq_len = trained_seq_len(meta, model.config.max_seq_len)
    windows = evaluate_text(model, tok, [str(valid)], seq_len, from_start=True)
    short, whole = sample_runs(model, tok, NEW_TOKENS), sample_runs(model, tok, None)
    lengths = held_out_lengths(tok, valid)
    shares = repetition(model, tok)
    induction = induction_report(path)
    return {
        "model": str(path),
        "per_document": {"bits_per_byte": docs.bits_per_byte, "loss": docs.loss, "tokens": docs.tokens,
                         "bytes": docs.bytes, "documents": docs.documents, "truncated": docs.truncated,
                         "context": docs.context,
                         "bands": [{"first": a, "last": b, "tokens": n, "loss": loss} for a, b, n, loss in docs.bands],
                         "same_documents": [{"first": a, "last": b, "documents": k, "loss": loss}
                                            for a, b, k, loss in docs.same_documents]},
        "windows": {"seq_len": seq_len, "bits_per_byte": windows.bits_per_byte, "loss": windows.loss,
                    "tokens": windows.tokens, "bytes": windows.bytes},
        "samples": short,
        "ended_before_150": float(np.mean([r["ended"] for r in short])),
        "ended_before_60": float(np.mean([r["ended"] and r["new_tokens"] < EARLY for r in short])),
        "median_new_tokens": float(np.median([r["new_tokens"] for r in short])),
        "samples_to_the_end": whole,
        "median_sampled_story_tokens": float(np.median([r["story_tokens"] for r in whole])),
        "held_out_median_story_tokens": float(np.median(lengths)),
        "repeated_4gram_share": dict(zip(PROMPTS, shares)),
        "repeated_4gram_mean": float(np.mean(shares)),
        "induction": {"best": induction["best"], "layer": induction["layer"], "head": induction["head"],
                      "chance": induction["chance"], "first_copy_loss": induction["first"],
                      "second_copy_loss": induction["second"],
                      "second_best": float(np.sort(induction["scores"].ravel())[-2])},
    }


def text(r: dict) -> str:
    d, w, ind = r["per_document"], r["windows"], r["induction"]
    bands = [b["loss"] for b in d["bands"]]
    low = np.average(bands[:2], weights=[b["tokens"] for b in d["bands"][:2]])
    lines = [
        f"model: {r['model']}",
        f"held-out bits per byte, per document (up to {d['context']} tokens, {d['documents']:,} stories, "
        f"{d['truncated']} cut): {d['bits_per_byte']:.4f}  (loss {d['loss']:.4f} nats/token, {d['tokens']:,} tokens, "
        f"{d['bytes']:,} bytes)",
        *[f"  positions {b['first']:>3}-{b['last']:<3}: loss {b['loss']:.4f} ({b['tokens']:,} tokens; "
          f"{b['loss'] / low - 1:+.1%} against 0-255"
          + (f"; {b['loss'] / ref['loss'] - 1:+.1%} against the same {ref['documents']} stories at 0-255"
             if b["first"] > 255 else "") + ")"
          for b, ref in zip(d["bands"], d["same_documents"]) if b["tokens"]],
        f"held-out bits per byte, {w['seq_len']}-token windows: {w['bits_per_byte']:.4f}  (loss {w['loss']:.4f}, "
        f"{w['tokens']:,} tokens, {w['bytes']:,} bytes)",
        f"samples (15, at most {NEW_TOKENS} new tokens): ended before {NEW_TOKENS}: {r['ended_before_150']:.0%}, "
        f"before {EARLY}: {r['ended_before_60']:.0%}; median {r['median_new_tokens']:.0f} new tokens",
        "  new tokens: " + ", ".join(f"{s['new_tokens']}{'*' if s['ended'] else ''}" for s in r["samples"])
        + "   (* ended with the end-of-text token)",
        f"samples drawn to the end of the story: median {r['median_sampled_story_tokens']:.0f} tokens with the "
        f"prompt; held-out stories: median {r['held_out_median_story_tokens']:.0f} tokens",
        "  story tokens: " + ", ".join(f"{s['story_tokens']}{'' if s['ended'] else '+'}"
                                       for s in r["samples_to_the_end"]) + "   (+ did not end in the context)",
        "repeated 4-grams in 200 greedy tokens: "
        + ", ".join(f"{v:.2f}" for v in r["repeated_4gram_share"].values()) + f"  (mean {r['repeated_4gram_mean']:.2f})",
        f"induction: best score {ind['best']:.3f} (layer {ind['layer']}, head {ind['head']}), second best "
        f"{ind['second_best']:.3f}, chance {ind['chance']:.3f}; loss first copy {ind['first_copy_loss']:.2f}, "
        f"second copy {ind['second_copy_loss']:.2f} nats/token",
    ]
    return "\n".join(lines)


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model", nargs="?", default=None, help="model file (default: the bundled model)")
    parser.add_argument("--valid", default=str(VALID), help="held-out story file (default: %(default)s)")
    parser.add_argument("--json", action="store_true", help="print the figures as one JSON object")
    args = parser.parse_args(argv)
    r = report(args.model, args.valid)
    print(json.dumps(r, indent=1) if args.json else text(r))
    return 0


if __name__ == "__main__":
    sys.exit(main())
