"""Turn a finished training run into the package's bundled model and its model card.

Run from the repository root once the run has reached its last step::

    python -m tools.finish_bundled --run runs/bundled512

It

1. checks that the run finished (the training state is at its last step);
2. re-evaluates the run's ``model.safetensors`` on the held-out file the run used
   (``glassllm eval`` semantics: non-overlapping windows of the trained length, read from the start
   of a story, the stories' own bytes);
3. evaluates the fixed probe text below -- the same text ``tests/test_train.py::PROBE_TEXT``
   evaluates -- and records its SHA-256, loss and bits per byte, so the test can check the shipped
   figures;
4. draws the card's samples, unedited, with the library's sampler
   (:func:`glassllm.generate.generate_text`): five fixed prompts, seeds 0 and 1, temperature 0.8,
   top-k 40, at most 200 new tokens each, stopping at ``<|endoftext|>``; and the greedy continuation
   of each prompt;
5. measures this model and the model it replaces with ``tools/specimen_report.py`` (bits per byte
   both ways, loss by position band, how samples end, repetition, induction) for the card's
   before/after table;
6. writes ``src/glassllm/assets/tinystories.safetensors`` (weights, config, tokenizer, and these
   figures as metadata; at most 8 MB), copies the loss curve to ``assets/loss.png`` and the
   training timeline to ``assets/tinystories.timeline.safetensors`` (a second stage's joined to the
   first's, :meth:`glassllm.timeline.Timeline.then`), and writes
   ``assets/MODEL_CARD.md``.

A run that started from another model (``glassllm train --init-from``) is the second stage of a
two-stage recipe: ``--base`` names the first stage's model file (default: the shipped model, which
the second stage started from), and the card gives both stages' commands, steps, tokens and time.
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
                        help="the model this one replaces, for the before/after figures (default: the shipped model)")
    parser.add_argument("--before-report", default=None,
                        help="python -m tools.specimen_report --json output for --before, to reuse instead of measuring it again")
    parser.add_argument("--base", default=None,
                        help="for a run made with --init-from: the model file it started from (default: --before)")
    args = parser.parse_args(argv)

    from safetensors import safe_open

    from glassllm.checkpoint import atomic_write, bundled_model_path, load_model, read_header, save_model
    from glassllm.generate import generate_text
    from glassllm.train import evaluate_text

    from tools.induction_scores import induction_report
    from tools.specimen_report import report

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
    held_out = valid_files[0]
    print("measuring the figures of the card's before/after table ...", flush=True)
    after_report = report(run / "model.safetensors", held_out)
    if args.before_report:
        before_report = json.loads(Path(args.before_report).read_text(encoding="utf-8"))
    else:
        before_report = report(before_path, held_out)
    repeats = {"after": list(after_report["repeated_4gram_share"].values()),
               "before": list(before_report["repeated_4gram_share"].values()), "before_model": before_path.name}
    base = base_path = None
    if meta.get("init_from"):
        base_path = Path(args.base) if args.base else before_path
        _, base_meta = read_header(base_path)
        base = {"command": base_meta["command"], "wall_time_s": float(base_meta["wall_time_s"]),
                "tokens_seen": int(base_meta["tokens_seen"]), "steps": int(base_meta["step"]),
                "train_config": json.loads(base_meta["train_config"]),
                "train_data_sha256": json.loads(base_meta["train_data_sha256"])}

    extra = {k: v for k, v in meta.items() if k not in ("format", "version", "config", "tokenizer")}
    docs = after_report["per_document"]
    extra.update({
        "valid_loss": repr(valid.loss), "valid_perplexity": repr(valid.perplexity),
        "valid_bits_per_byte": repr(valid.bits_per_byte), "valid_tokens": str(valid.tokens),
        "valid_bytes": str(valid.bytes),
        "valid_per_document": json.dumps({"bits_per_byte": docs["bits_per_byte"], "loss": docs["loss"],
                                          "bands": docs["bands"]}),
        "probe_sha256": hashlib.sha256(PROBE_TEXT.encode("utf-8")).hexdigest(),
        "probe_loss": repr(probe.loss), "probe_bits_per_byte": repr(probe.bits_per_byte),
        "probe_bytes": str(probe.bytes),
        "samples": json.dumps({"sampling": SAMPLING, "samples": samples}),
        "repetition": json.dumps(repeats),
        "packaged": datetime.now(timezone.utc).isoformat(timespec="seconds"),
    })
    if base:
        extra["base"] = json.dumps(base)
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
        from glassllm.timeline import load_timeline, timeline_path_for

        timeline = dest / (target.name.removesuffix(".safetensors") + ".timeline.safetensors")
        if base and timeline_path_for(base_path).exists():           # both stages, one timeline
            load_timeline(base_path).then(load_timeline(run)).save(timeline)
        else:
            shutil.copyfile(run / "timeline.safetensors", timeline)
        os.chmod(timeline, 0o644)
    (run / "specimen_report.json").write_text(json.dumps({"after": after_report, "before": before_report}, indent=1))

    card = model_card(model, extra, config, valid, probe, samples, size, induction_report(target),
                      {"after": after_report, "before": before_report, "before_model": before_path.name}, base)
    atomic_write(dest / "MODEL_CARD.md", card)
    os.chmod(dest / "MODEL_CARD.md", 0o644)
    print(f"wrote {target} ({size:,} bytes) and {dest / 'MODEL_CARD.md'}")
    return 0


# What the model still gets wrong, written after reading the samples above (keep it honest when retraining).
LIMITS = """\
A one-million-parameter model trained on 18 MB of children's stories. It writes short stories in the
TinyStories mould, mostly grammatical, with the corpus's names, objects and morals. It still loses the
thread: characters change name or sex within a story, an object introduced in one sentence does
something impossible in the next, dialogue is often attributed to the wrong speaker, and a story rarely
has a real plot beyond one problem and its solution. Greedy decoding circles back to the same phrases
after a few sentences (the repetition row above), so sample at a temperature near 0.8 for reading; even
then a draw can fall into a loop. It knows nothing outside the world of these stories. It is a specimen
to study, not an assistant."""


def _run_dir(command: str, default: str = "runs/train") -> str:
    words = command.split()
    return words[words.index("--out") + 1] if "--out" in words else default   # glassllm train's default


def _comparison(reports) -> list[str]:
    """The card's before/after table, from two tools/specimen_report.py results."""
    before, after = reports["before"], reports["after"]

    def bands(r):
        return {(b["first"], b["last"]): b["loss"] for b in r["per_document"]["bands"]}

    def same(r):
        return {(b["first"], b["last"]): b["loss"] for b in r["per_document"]["same_documents"]}

    def row(label, key, fmt):
        return f"| {label} | {fmt(key(before))} | {fmt(key(after))} |"

    f4 = "{:.4f}".format
    f3 = "{:.3f}".format
    pct = "{:.0%}".format
    rows = [
        "| | before | after |",
        "|---|---:|---:|",
        row("held-out bits per byte, each story alone up to 512 tokens (`glassllm eval --per-document`)",
            lambda r: r["per_document"]["bits_per_byte"], f4),
        row("held-out bits per byte, windows of the trained length (`glassllm eval`)",
            lambda r: r["windows"]["bits_per_byte"], f4),
        row("trained window", lambda r: r["windows"]["seq_len"], str),
    ]
    for first, last in bands(after):
        rows.append(row(f"loss at positions {first}–{last}, each story alone (nats/token)",
                        lambda r, k=(first, last): bands(r)[k], f3))
    for first, last in list(bands(after))[2:]:
        rows.append(row(f"positions {first}–{last} against the same stories at 0–255",
                        lambda r, k=(first, last): bands(r)[k] / same(r)[k] - 1, "{:+.1%}".format))
    rows += [
        row("card samples (15, at most 150 new tokens) that end before 60 new tokens",
            lambda r: r["ended_before_60"], pct),
        row("... that end before 150 new tokens", lambda r: r["ended_before_150"], pct),
        row("median length of the 15 samples drawn to the story's end (tokens, prompt included)",
            lambda r: r["median_sampled_story_tokens"], "{:.0f}".format),
        row("median length of the held-out stories (tokens)", lambda r: r["held_out_median_story_tokens"],
            "{:.0f}".format),
        row("repeated 4-grams in 200 greedy tokens, mean of the 5 prompts", lambda r: r["repeated_4gram_mean"],
            "{:.2f}".format),
        row("induction test: best head's score (chance 0.017)", lambda r: r["induction"]["best"], f3),
    ]
    return rows


def _stage_rows(base, meta, config) -> list[str]:
    """Steps, tokens and wall time of each stage (one row each when the run had no first stage)."""
    wall = float(meta["wall_time_s"])
    tokens = int(meta["tokens_seen"])
    shape = f"{config['batch_size']} x {config['seq_len']}"
    if not base:
        return [f"| steps | {meta['step']} |",
                f"| tokens seen | {tokens:,} (steps x {shape}) |",
                f"| wall time | {wall:.0f} s ({wall / 60:.1f} min) of training and evaluation on a 2-core machine "
                "shared with other work |"]
    b = base["train_config"]
    total = wall + base["wall_time_s"]
    return [
        f"| steps | {base['steps']:,} (stage 1, {b['batch_size']} x {b['seq_len']} tokens) + {int(meta['step']):,} "
        f"(stage 2, {shape} tokens) |",
        f"| tokens seen | {base['tokens_seen']:,} + {tokens:,} = {base['tokens_seen'] + tokens:,} |",
        f"| wall time | {base['wall_time_s']:.0f} s + {wall:.0f} s = {total:.0f} s ({total / 3600:.2f} h) of training "
        "and evaluation on a 2-core machine shared with other work |",
    ]


def model_card(model, meta, config, valid, probe, samples, size, induction, reports, base=None) -> str:
    c = model.config
    train_sha = json.loads(meta["train_data_sha256"])
    valid_sha = json.loads(meta["valid_data_sha256"])
    run_dir = _run_dir(meta["command"])
    short_share = config.get("short_repeat_fraction", -1)
    short_share = config["repeat_fraction"] if short_share < 0 else short_share
    docs = reports["after"]["per_document"]
    reach = {str(b["first"]): b["documents"] for b in docs["same_documents"]}
    names = ", ".join(f"`{Path(f).name}`" for f in train_sha)
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
        f"(training text {names}; `valid.txt`: 1,000 held-out stories, never trained on;",
        "gathered from public copies of TinyStories; the files are not distributed with glassllm, and their",
        "SHA-256 sums are below). Trained on other text, for example `--data tinystories:train` (the full",
        "TinyStoriesV2 file), the same commands make a different model with different figures.",
        "",
    ]
    if base:
        base_dir = _run_dir(base["command"])
        lines += [
            "It is made in two stages. Stage 1 trains the tokenizer and the model from scratch on 256-token",
            "windows; `finish_bundled.py` makes it the bundled model. Stage 2 continues that model",
            "(`--init-from bundled`) on 512-token windows, on more text, with most windows starting where a",
            "story starts, so that the model is right at every position of its context and its stories run",
            "their course:",
            "",
            "```",
            base["command"],
            f"python -m tools.finish_bundled --run {base_dir}",
            meta["command"],
            f"python -m tools.finish_bundled --run {run_dir} --base {base_dir}/model.safetensors",
            "```",
            "",
        ]
    else:
        lines += ["```", meta["command"], f"python -m tools.finish_bundled --run {run_dir}", "```", ""]
    lines += [
        "The commands are the ones the model file records, with the paths of the machine that ran them.",
        "`glassllm train` trains (in the run folder given by `--out`); `finish_bundled.py` re-evaluates the",
        "result, draws the samples below and writes this card and the model file. `--threads 1` and",
        "`--workers N` only choose how many cores the arithmetic uses.",
        "",
        "## Figures",
        "",
        "| | |",
        "|---|---|",
        f"| seed | {meta['seed']} |",
        *[f"| training data | `{Path(f).name}`, SHA-256 `{h}` |" for f, h in train_sha.items()],
        *[f"| held-out data | `{Path(f).name}`, SHA-256 `{h}` |" for f, h in valid_sha.items()],
        *_stage_rows(base, meta, config),
        f"| final training loss | {float(meta['train_loss']):.4f} (last batch) |",
        f"| held-out loss | {meta['valid_loss']} nats/token (perplexity {valid.perplexity:.3f}) |",
        f"| held-out bits per byte | {meta['valid_bits_per_byte']} |",
        f"| held-out bits per byte, each story alone (`glassllm eval --per-document`) | {docs['bits_per_byte']:.4f} |",
        "| loss by position, each story alone: " + " / ".join(f"{b['first']}–{b['last']}" for b in docs["bands"])
        + " | " + " / ".join(f"{b['loss']:.3f}" for b in docs["bands"]) + " nats/token |",
        f"| held-out size | {valid.tokens:,} predicted tokens, {valid.bytes:,} bytes |",
        f"| probe text loss | {meta['probe_loss']} (bits/byte {meta['probe_bits_per_byte']}, SHA-256 `{meta['probe_sha256'][:16]}...`) |",
        f"| model file | {size:,} bytes |",
        "",
        "Held-out figures use `glassllm eval` semantics: the text is encoded with the model's tokenizer, read",
        f"after `<|endoftext|>` and a newline, and cut into non-overlapping {config['seq_len']}-token windows;",
        "every token after that start is predicted once. Loss is the mean of the nats over predicted tokens;",
        "bits per byte divides the total nats by ln 2 times the UTF-8 bytes of the stories' own text (the",
        "separator lines between stories count none). Each story alone (`--per-document`) reads every",
        "held-out story by itself from `<|endoftext|>`, as a prompt is read, up to the 512-token context;",
        "the loss by position band shows how well the model does deep into its context. Re-check with",
        "`glassllm eval --data ../shared/data/tinystories/valid.txt --per-document`.",
        "The probe text is a short story written for `tests/test_train.py`, which re-evaluates the shipped",
        "model on it and compares with the loss recorded here.",
        "",
        "## Before and after",
        "",
        f"Every figure of `python -m tools.specimen_report`, for the model this one replaced",
        f"(`{reports['before_model']}`) and for this one:",
        "",
        *_comparison(reports),
        "",
        "The position bands average over the stories long enough to reach them: of the "
        f"{docs['documents']:,} held-out",
        f"stories, {reach['256']:,} reach position 256 and {reach['384']:,} reach 384, so the later bands are "
        "measured on fewer, longer stories than the first two.",
        "",
        "![loss curve](loss.png)",
        "",
        f"The held-out points during training are measured on the first {config['eval_windows']} windows of the",
        "held-out text, to keep them cheap; the last point is the whole held-out text (the figure in the table).",
        "",
        "## Model",
        "",
        f"LLaMA-style decoder: {model.num_params():,} parameters, vocabulary {c.vocab_size} (byte-level BPE trained",
        f"on the stage-1 training text), width {c.dim}, {c.n_layers} layers, {c.n_heads} query heads sharing {c.n_kv_heads}",
        f"key/value heads of size {c.head_dim}, SwiGLU width {c.ffn_dim}, RMSNorm, interleaved RoPE",
        f"(theta {c.rope_theta:g}), no biases, context up to {c.max_seq_len} positions (trained on {config['seq_len']}).",
        "Weights are float32.",
        "",
        "## Training",
        "",
    ]
    if base:
        b = base["train_config"]
        lines += [
            f"Stage 1: {base['steps']:,} steps of {b['batch_size']} windows of {b['seq_len']} tokens, learning rate",
            f"warmed up to {b['lr']} and cosine-decayed to {b['min_lr']}; the first {b['short_steps']:,} steps take",
            f"{b['batch_size'] * b['seq_len'] // b['short_seq_len']} windows of {b['short_seq_len']} tokens (a",
            "sequence-length warm-up, the same tokens per step), and a share of the windows",
            f"({b['short_repeat_fraction']} during the warm-up, {b['repeat_fraction']} after it) are one span of random",
            "tokens repeated until the window is full. Both grow the induction head (docs/lessons/10-training.md and",
            "11-reading-heads.md; the runs that led to this recipe are in docs/training-log.md). Stage 2, whose",
            "settings these are:",
            "",
        ]
    lines += [
        "```",
        json.dumps(config, indent=2, sort_keys=True),
        "```",
        "",
        f"AdamW (betas {config['beta1']}, {config['beta2']}, eps {config['eps']}) with decoupled weight decay",
        f"{config['weight_decay']} on the weight matrices only (not the norm gains); learning rate warmed up",
        f"linearly over {config['warmup_steps'] if config['warmup_steps'] >= 0 else min(100, config['steps'] // 10)} steps "
        f"to {config['lr']}, then cosine-decayed to {config['min_lr']};",
        f"gradients clipped to global norm {config['grad_clip']}. Batches are {config['batch_size']} random windows of",
        f"{config['seq_len']} tokens drawn from a seeded generator",
    ]
    if config.get("short_steps", 0) > 0:
        lines += [
            f"except that the first {config['short_steps']:,} steps take "
            f"{config['batch_size'] * config['seq_len'] // config['short_seq_len']} windows of {config['short_seq_len']} "
            "tokens (a sequence-length warm-up, the same tokens per step),",
        ]
    if config.get("doc_start_fraction", 0) > 0:
        lines += [f"({config['doc_start_fraction']:.0%} of the text windows start where a story starts, as a prompt is read),"]
    lines += [
        f"and a share of the windows ({short_share if config.get('short_steps', 0) > 0 else config['repeat_fraction']}) "
        f"are one span of {config['repeat_tokens']} tokens repeated until the window is full.",
        "",
        "Copying, measured by `python -m tools.induction_scores` (8 random 40-token sequences, each followed by",
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
    after = list(reports["after"]["repeated_4gram_share"].values())
    before = list(reports["before"]["repeated_4gram_share"].values())
    lines += [
        "## Repetition",
        "",
        f"The share of 4-grams that repeat an earlier 4-gram, in {GREEDY_TOKENS} greedy tokens after each prompt",
        f"(no stop at the end of a story), for the model this one replaced (`{reports['before_model']}`) and this one:",
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
