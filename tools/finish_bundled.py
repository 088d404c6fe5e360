"""Turn the finished bundled training run into the package's model and model card.

Run from the repository root once ``runs/bundled`` has reached its last step::

    python tools/finish_bundled.py

It

1. checks that the run finished (the training state is at its last step);
2. re-evaluates the run's ``model.safetensors`` on the held-out file the run
   used (``glassllm eval`` semantics: non-overlapping windows of the trained length, loss,
   perplexity, bits per byte);
3. evaluates the fixed probe text below -- the same text
   ``tests/test_train.py::PROBE_TEXT`` evaluates -- and records its SHA-256,
   loss and bits per byte, so the test can check the shipped figures;
4. draws ten samples, unedited, with the library's sampler
   (:func:`glassllm.generate.generate_text`): five fixed prompts, seeds 0 and 1,
   temperature 0.8, top-k 40, at most 200 new tokens each, stopping at
   ``<|endoftext|>``; and the greedy continuation of each prompt;
5. measures repetition: the share of repeated 4-grams in 200 greedy tokens
   after each of the five prompts, for this model and for ``--before`` (the
   model it replaces);
6. runs the repeated-random-tokens test of ``tools/induction_scores.py``;
7. writes ``src/glassllm/assets/tinystories.safetensors`` (weights, config,
   tokenizer, and all these figures as metadata; at most 8 MB), copies the
   loss curve to ``assets/loss.png`` and the training timeline to
   ``assets/tinystories.timeline.safetensors``, and writes ``assets/MODEL_CARD.md``.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import shutil
import sys
from datetime import datetime, timezone
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ASSETS = ROOT / "src" / "glassllm" / "assets"
MAX_BYTES = 8 * 1024 * 1024

# Keep identical to tests/test_train.py::PROBE_TEXT (the test compares SHA-256s).
PROBE_TEXT = (
    "Once upon a time, there was a little dog named Max. Max liked to run in the park with his red ball.\n"
    "One day, Max saw a small bird on a tree. The bird was sad because it could not find its mom.\n"
    "Max said, \"Do not be sad. I will help you!\" They looked under the big tree and near the pond.\n"
    "At last, they found the mom bird. The little bird was so happy. Max wagged his tail and went home.\n"
    "<|endoftext|>\n"
)
PROMPTS = ["Once upon a time", "One day, a little girl named Lily", "Tom and his dog", "The sun was hot",
           "Mia had a big red box"]
SEEDS = (0, 1)
SAMPLING = {"temperature": 0.8, "top_k": 40, "max_new_tokens": 200}
GREEDY_TOKENS = 200


def repeated_4gram_share(ids) -> float:
    """Share of the 4-grams of ``ids`` that already occurred earlier in ``ids``.

    >>> repeated_4gram_share([1, 2, 3, 4, 1, 2, 3, 4])   # 5 four-grams; the last, 1 2 3 4, is a repeat
    0.2
    """
    grams = [tuple(ids[i:i + 4]) for i in range(len(ids) - 3)]
    seen, repeats = set(), 0
    for g in grams:
        repeats += g in seen
        seen.add(g)
    return repeats / max(len(grams), 1)


def repetition(model, tok) -> list[float]:
    """For each prompt, the repeated-4-gram share of its next 200 greedy tokens (no stop at end of text)."""
    from glassllm.generate import generate

    shares = []
    for prompt in PROMPTS:
        ids = [t.id for t in generate(model, None, tok.encode(prompt), max_new_tokens=GREEDY_TOKENS, temperature=0)]
        shares.append(repeated_4gram_share(ids))
    return shares


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--run", default=str(ROOT / "runs" / "bundled"), help="the training run folder")
    parser.add_argument("--valid", default=None, help="held-out text (default: the run's own --valid files)")
    parser.add_argument("--allow-unfinished", action="store_true", help="package a run that has not finished")
    parser.add_argument("--dest", default=str(ASSETS), help="folder for the model, card and curve (default: the package's assets)")
    parser.add_argument("--before", default=None,
                        help="the model this one replaces, for the repetition figure (default: the shipped model)")
    args = parser.parse_args(argv)

    from safetensors import safe_open

    from glassllm.checkpoint import atomic_write, bundled_model_path, load_model, save_model
    from glassllm.generate import generate_text
    from glassllm.train import evaluate_text

    run = Path(args.run)
    with safe_open(str(run / "train_state.safetensors"), framework="numpy") as f:
        state = f.metadata()
    config = json.loads(state["train_config"])
    step = int(state["step"])
    if step != config["steps"] and not args.allow_unfinished:
        print(f"the run in {run} is at step {step} of {config['steps']}; wait for it to finish", file=sys.stderr)
        return 2
    model, tok, meta = load_model(run / "model.safetensors")
    if meta["step"] != str(step):
        print(f"model.safetensors is at step {meta['step']} but the state at {step}; resume the run to "
              "re-export it", file=sys.stderr)
        return 2

    valid_files = [args.valid] if args.valid else [f for f, _ in json.loads(state["data"])["valid"]]
    print(f"evaluating on {valid_files} ...", flush=True)
    valid = evaluate_text(model, tok, valid_files, config["seq_len"], from_start=True)   # as glassllm eval reads it
    probe = evaluate_text(model, tok, PROBE_TEXT)
    print(f"held-out: {valid.line()}\nprobe:    {probe.line()}", flush=True)

    samples = []
    for prompt in PROMPTS:
        for seed in SEEDS:
            text = generate_text(model, tok, prompt, seed=seed, **SAMPLING)
            samples.append({"prompt": prompt, "seed": seed, "text": prompt + text})
            print(f"--- sample {prompt!r} seed {seed} ---\n{prompt + text}", flush=True)
        text = generate_text(model, tok, prompt, temperature=0, max_new_tokens=SAMPLING["max_new_tokens"])
        samples.append({"prompt": prompt, "seed": None, "text": prompt + text})
        print(f"--- greedy {prompt!r} ---\n{prompt + text}", flush=True)
    before_path = Path(args.before) if args.before else bundled_model_path()
    before_model, before_tok, _ = load_model(before_path)
    repeats = {"after": repetition(model, tok), "before": repetition(before_model, before_tok),
               "before_model": before_path.name}
    print(f"repeated 4-grams in 200 greedy tokens: {repeats}", flush=True)

    extra = {k: v for k, v in meta.items() if k not in ("format", "version", "config", "tokenizer")}
    extra.update({
        "valid_loss": repr(valid.loss), "valid_perplexity": repr(valid.perplexity),
        "valid_bits_per_byte": repr(valid.bits_per_byte), "valid_tokens": str(valid.tokens),
        "valid_bytes": str(valid.bytes),
        "probe_sha256": hashlib.sha256(PROBE_TEXT.encode("utf-8")).hexdigest(),
        "probe_loss": repr(probe.loss), "probe_bits_per_byte": repr(probe.bits_per_byte),
        "probe_bytes": str(probe.bytes),
        "samples": json.dumps({"sampling": SAMPLING, "samples": samples}),
        "repetition": json.dumps(repeats),
        "packaged": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    })
    dest = Path(args.dest)
    target = bundled_model_path() if dest == ASSETS else dest / bundled_model_path().name
    save_model(target, model, tok, extra)
    os.chmod(target, 0o644)
    size = target.stat().st_size
    if size > MAX_BYTES:
        target.unlink()
        print(f"the model file is {size} bytes, over the 8 MB limit; not shipped", file=sys.stderr)
        return 2
    if (run / "loss.png").exists():
        shutil.copyfile(run / "loss.png", dest / "loss.png")
    if (run / "timeline.safetensors").exists():
        timeline = dest / (target.name.removesuffix(".safetensors") + ".timeline.safetensors")
        shutil.copyfile(run / "timeline.safetensors", timeline)
        os.chmod(timeline, 0o644)
    sys.path.insert(0, str(ROOT / "tools"))
    from induction_scores import induction_report

    card = model_card(model, extra, config, valid, probe, samples, size, induction_report(target), repeats)
    atomic_write(dest / "MODEL_CARD.md", card)
    os.chmod(dest / "MODEL_CARD.md", 0o644)
    print(f"wrote {target} ({size:,} bytes) and {dest / 'MODEL_CARD.md'}")
    return 0


# What the model still gets wrong, written after reading the samples above (keep it honest when retraining).
LIMITS = """\
A one-million-parameter model trained on 16.8 MB of children's stories. It writes short stories in the
TinyStories mould, mostly grammatical, with the corpus's names, objects and morals. It still loses the
thread: characters change name or sex within a story, an object introduced in one sentence does
something impossible in the next, dialogue is often attributed to the wrong speaker, and a story rarely
has a real plot beyond one problem and its solution. Greedy decoding circles back to the same phrases
after a few sentences (the repetition table above: fewer repeated 4-grams than the model it replaced,
but still some), so sample at a temperature near 0.8 for reading; even then a draw can fall into a
loop of one word, as one sample above shows. It knows nothing outside the world of these stories. It
is a specimen to study, not an assistant."""


def model_card(model, meta, config, valid, probe, samples, size, induction, repeats) -> str:
    c = model.config
    train_sha = json.loads(meta["train_data_sha256"])
    valid_sha = json.loads(meta["valid_data_sha256"])
    wall = float(meta["wall_time_s"])
    words = meta["command"].split()
    run_dir = words[words.index("--out") + 1] if "--out" in words else "runs/train"   # glassllm train's default
    short_share = config.get("short_repeat_fraction", -1)
    short_share = config["repeat_fraction"] if short_share < 0 else short_share
    lines = [
        "# glassllm TinyStories model",
        "",
        "The model that ships inside the package (`glassllm/assets/tinystories.safetensors`) and that",
        "`glassllm generate`, `glassllm inspect` and the lessons use when no `--model` is given. It was",
        "trained from scratch on a CPU by glassllm's own NumPy autograd and AdamW -- no PyTorch involved.",
        "",
        "## Reproduce it",
        "",
        "From the repository root, with the developers' TinyStories subset in `../shared/data/tinystories/`",
        "(`train.txt` and `extra.txt`: 20,368 training stories, 16.8 MB; `valid.txt`: 1,000 held-out stories;",
        "gathered from public copies of TinyStories; the files are not distributed with glassllm, and their",
        "SHA-256 sums are below). Trained on other text, for example",
        "`--data tinystories:train` (the full TinyStoriesV2 file), the same command makes a different model",
        "with different figures:",
        "",
        "```",
        meta["command"],
        f"python tools/finish_bundled.py --run {run_dir}",
        "```",
        "",
        "The first command trains the tokenizer and the model (in the run folder given by `--out`); the second",
        "re-evaluates it, draws the samples below and writes this card and the model file. The",
        "hyperparameters are `glassllm.train.RECIPES[\"bundled\"]` (listed below); `--threads 1` only pins BLAS",
        "to one thread.",
        "",
        "## Figures",
        "",
        "| | |",
        "|---|---|",
        f"| seed | {meta['seed']} |",
        *[f"| training data | `{Path(f).name}`, SHA-256 `{h}` |" for f, h in train_sha.items()],
        *[f"| held-out data | `{Path(f).name}`, SHA-256 `{h}` |" for f, h in valid_sha.items()],
        f"| steps | {meta['step']} |",
        f"| tokens seen | {int(meta['tokens_seen']):,} (steps x {config['batch_size']} x {config['seq_len']}) |",
        f"| wall time | {wall:.0f} s ({wall / 60:.1f} min) of training and evaluation, 1 BLAS thread on a 2-core machine shared with other work |",
        f"| final training loss | {float(meta['train_loss']):.4f} (last batch) |",
        f"| held-out loss | {meta['valid_loss']} nats/token (perplexity {valid.perplexity:.3f}) |",
        f"| held-out bits per byte | {meta['valid_bits_per_byte']} |",
        f"| held-out size | {valid.tokens:,} predicted tokens, {valid.bytes:,} bytes |",
        f"| probe text loss | {meta['probe_loss']} (bits/byte {meta['probe_bits_per_byte']}, SHA-256 `{meta['probe_sha256'][:16]}...`) |",
        f"| model file | {size:,} bytes |",
        "",
        "Held-out figures use `glassllm eval` semantics: the text is encoded with the model's tokenizer, read",
        f"after `<|endoftext|>` and a newline, and cut into non-overlapping {config['seq_len']}-token windows;",
        "every token after that start is predicted once. Loss is the mean of the nats over predicted tokens;",
        "bits per byte divides the total nats by ln 2 times the UTF-8 bytes of the stories' own text (the",
        "separator lines between stories count none). `python tools/specimen_report.py` gives the",
        "per-document figures and the loss by position band. Re-check with",
        "`glassllm eval --data ../shared/data/tinystories/valid.txt`.",
        "The probe text is a short story written for `tests/test_train.py`, which re-evaluates the shipped",
        "model on it and compares with the loss recorded here.",
        "",
        "![loss curve](loss.png)",
        "",
        f"The held-out points during training are measured on the first {config['eval_windows']} windows of the",
        "held-out text, to keep them cheap; the last point is the whole held-out text (the figure in the table),",
        "whose windows are harder on average, which is why the curve ends with a step up.",
        "",
        "## Model",
        "",
        f"LLaMA-style decoder: {model.num_params():,} parameters, vocabulary {c.vocab_size} (byte-level BPE trained",
        f"on the training text), width {c.dim}, {c.n_layers} layers, {c.n_heads} query heads sharing {c.n_kv_heads}",
        f"key/value heads of size {c.head_dim}, SwiGLU width {c.ffn_dim}, RMSNorm, interleaved RoPE",
        f"(theta {c.rope_theta:g}), no biases, context up to {c.max_seq_len} positions (trained on {config['seq_len']}).",
        "Weights are float32.",
        "",
        "## Training",
        "",
        "```",
        json.dumps(config, indent=2, sort_keys=True),
        "```",
        "",
        f"AdamW (betas {config['beta1']}, {config['beta2']}, eps {config['eps']}) with decoupled weight decay",
        f"{config['weight_decay']} on the weight matrices only (not the norm gains); learning rate warmed up",
        f"linearly over {config['warmup_steps'] if config['warmup_steps'] >= 0 else min(100, config['steps'] // 10)} steps "
        f"to {config['lr']}, then cosine-decayed to {config['min_lr']};",
        f"gradients clipped to global norm {config['grad_clip']}. Batches are {config['batch_size']} random windows of",
        f"{config['seq_len']} tokens drawn from a seeded generator, except that the first {config['short_steps']:,} steps",
        f"take {config['batch_size'] * config['seq_len'] // config['short_seq_len']} windows of {config['short_seq_len']} tokens "
        "(a sequence-length warm-up, the same tokens per step), and",
        f"that a share of the windows ({short_share} during the warm-up, {config['repeat_fraction']} after it) are one "
        f"span of {config['repeat_tokens']} tokens repeated until the window is full.",
        "Both are there to grow induction heads (docs/lessons/10-training.md and 11-reading-heads.md; the runs",
        "that led to this recipe are in docs/training-log.md).",
        "",
        "Copying, measured by `python tools/induction_scores.py` (8 random 40-token sequences, each followed by",
        f"itself): loss {induction['first']:.2f} nats/token on the first copy, {induction['second']:.2f} on the second;",
        f"the best head, layer {induction['layer']}, head {induction['head']}, puts {induction['best']:.3f} of its weight on",
        f"the induction cell (chance {induction['chance']:.3f}).",
        "",
        "## Samples",
        "",
        f"Unedited, drawn with `glassllm.generate.generate_text` at temperature {SAMPLING['temperature']},",
        f"top-k {SAMPLING['top_k']} (seeds {', '.join(map(str, SEEDS))}), and greedily (temperature 0), at most",
        f"{SAMPLING['max_new_tokens']} new tokens, stopping at `<|endoftext|>`.",
        "",
    ]
    for s in samples:
        how = "greedy" if s["seed"] is None else f"seed {s['seed']}"
        lines += [f"**Prompt `{s['prompt']}`, {how}:**", "", "```text", s["text"].rstrip(), "```", ""]
    after, before = repeats["after"], repeats["before"]
    lines += [
        "## Repetition",
        "",
        f"The share of 4-grams that repeat an earlier 4-gram, in {GREEDY_TOKENS} greedy tokens after each prompt",
        f"(no stop at the end of a story), for this model and for the model it replaced (`{repeats['before_model']}`,",
        "the earlier bundled model, trained on 6 MB with half its windows random repeated spans):",
        "",
        "| prompt | before | after |",
        "|---|---:|---:|",
        *[f"| `{p}` | {b:.2f} | {a:.2f} |" for p, b, a in zip(PROMPTS, before, after)],
        f"| mean | {sum(before) / len(before):.2f} | {sum(after) / len(after):.2f} |",
        "",
        "## Limits",
        "",
        LIMITS,
        "",
        "## Data and license",
        "",
        "TinyStories (Eldan & Li, 2023), CDLA-Sharing-1.0; the subset and its provenance are described in",
        "`../shared/data/README.md`. The model weights are not data under CDLA. glassllm ships a slice of the same",
        "training text (`stories.txt.xz`, 4,000 stories, and `stories-heldout.txt.xz`, 200 more; none from",
        "`valid.txt`), on which `glassllm train` trains when given no `--data`; where it came from, what was",
        "changed and its licence: `STORIES_NOTICE.md` and `CDLA-Sharing-1.0.txt`, beside this card.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
