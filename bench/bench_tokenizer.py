"""Benchmark: glassllm's tokenizer against Hugging Face ``tokenizers``, in one run.

    python -m bench.bench_tokenizer [--data FOLDER] [--json OUT] [--repeats N]

FOLDER holds ``train.txt`` and ``valid.txt`` (default: ../shared/data/tinystories).
Both tokenizers learn the same vocabulary size from the same ``train.txt``:
ours with its own pre-tokenisation, Hugging Face's ``BpeTrainer`` with the
GPT-2 byte-level pre-tokenizer (``ByteLevel``), the closest standard setup.
Reported, as medians over the repeats:

- training time, in seconds;
- encode throughput on ``valid.txt``, in MB/s (MB = 10^6 bytes of UTF-8), from
  a cold cache (a freshly loaded tokenizer) -- for Hugging Face both one call
  on the whole text and ``encode_batch`` over its lines (which uses threads);
- compression: bytes of ``valid.txt`` per token.

A third row runs *our* merges inside Hugging Face (``glassllm.hf.tokenizer_to_hf``)
and checks that the ids are identical.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]

from glassllm.hf import tokenizer_to_hf  # noqa: E402
from glassllm.tokenizer import EOT, Tokenizer  # noqa: E402


def timed(fn, repeats):
    """(median seconds, last result) of ``repeats`` calls of ``fn``."""
    times, result = [], None
    for _ in range(repeats):
        start = time.perf_counter()
        result = fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=ROOT / ".." / "shared" / "data" / "tinystories")
    parser.add_argument("--json", type=Path, help="also write the results here")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--vocab-size", type=int, default=1024)
    args = parser.parse_args(argv)

    import tokenizers
    from tokenizers import decoders, models, pre_tokenizers, trainers

    train_path, valid_path = args.data / "train.txt", args.data / "valid.txt"
    for p in (train_path, valid_path):
        if not p.is_file():
            print(f"bench_tokenizer: error: {str(p)!r} not found (pass --data FOLDER)", file=sys.stderr)
            return 2
    valid = valid_path.read_text(encoding="utf-8")
    valid_bytes = len(valid.encode("utf-8"))
    valid_lines = valid.splitlines(keepends=True)
    mb = valid_bytes / 1e6
    n = args.repeats

    # --- ours ---------------------------------------------------------------
    ours_train_s, ours = timed(lambda: Tokenizer.train([train_path], vocab_size=args.vocab_size), n)
    doc = ours.to_json()
    ours_enc_s, ours_ids = timed(lambda: Tokenizer.from_json(doc).encode(valid, allowed_special="all"), n)
    ours_corpus_s, _ = timed(lambda: Tokenizer.from_json(doc).encode_corpus(valid_path), n)
    ours_warm_s, _ = timed(lambda: ours.encode(valid, allowed_special="all"), n)

    # --- Hugging Face BpeTrainer, GPT-2 byte-level pre-tokenizer -----------------
    def hf_train():
        tok = tokenizers.Tokenizer(models.BPE())
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tok.decoder = decoders.ByteLevel()
        trainer = trainers.BpeTrainer(vocab_size=args.vocab_size, special_tokens=[EOT], show_progress=False,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
        tok.train([str(train_path)], trainer)
        return tok

    hf_train_s, hf = timed(hf_train, n)
    hf_doc = hf.to_str()
    hf_enc_s, hf_ids = timed(lambda: tokenizers.Tokenizer.from_str(hf_doc).encode(valid).ids, n)
    hf_batch_s, _ = timed(lambda: tokenizers.Tokenizer.from_str(hf_doc).encode_batch(valid_lines), n)

    # --- our merges, run by Hugging Face ---------------------------------------
    ours_in_hf = json.dumps(tokenizer_to_hf(ours))
    port_enc_s, port_ids = timed(lambda: tokenizers.Tokenizer.from_str(ours_in_hf).encode(valid).ids, n)
    port_batch_s, _ = timed(lambda: tokenizers.Tokenizer.from_str(ours_in_hf).encode_batch(valid_lines), n)

    results = {
        "data": str(args.data.resolve()), "vocab_size": args.vocab_size, "repeats": n,
        "train_bytes": train_path.stat().st_size, "valid_bytes": valid_bytes,
        "machine": {"python": platform.python_version(), "cpus": os.cpu_count(),
                    "tokenizers": tokenizers.__version__, "RAYON_NUM_THREADS": os.environ.get("RAYON_NUM_THREADS")},
        "glassllm": {"train_s": ours_train_s, "encode_mb_s": mb / ours_enc_s,
                     "encode_corpus_mb_s": mb / ours_corpus_s, "encode_warm_cache_mb_s": mb / ours_warm_s,
                     "valid_bytes_per_token": valid_bytes / len(ours_ids), "vocab_size": ours.vocab_size},
        "hf_bpe_trainer": {"train_s": hf_train_s, "encode_mb_s": mb / hf_enc_s,
                           "encode_batch_mb_s": mb / hf_batch_s,
                           "valid_bytes_per_token": valid_bytes / len(hf_ids), "vocab_size": hf.get_vocab_size()},
        "hf_running_our_merges": {"encode_mb_s": mb / port_enc_s, "encode_batch_mb_s": mb / port_batch_s,
                                  "ids_identical": port_ids == ours_ids},
    }

    g, h, p = results["glassllm"], results["hf_bpe_trainer"], results["hf_running_our_merges"]
    print(f"tokenizer benchmark: vocab {args.vocab_size}, train {results['train_bytes'] / 1e6:.1f} MB, "
          f"valid {mb:.2f} MB, median of {n}, {os.cpu_count()} CPUs, tokenizers {tokenizers.__version__}")
    print(f"{'':28}{'train s':>9}{'encode MB/s':>13}{'batch MB/s':>12}{'bytes/token':>13}")
    print(f"{'glassllm (pure Python)':28}{g['train_s']:9.2f}{g['encode_mb_s']:13.2f}{'':>12}"
          f"{g['valid_bytes_per_token']:13.3f}")
    print(f"{'HF BpeTrainer + ByteLevel':28}{h['train_s']:9.2f}{h['encode_mb_s']:13.2f}"
          f"{h['encode_batch_mb_s']:12.2f}{h['valid_bytes_per_token']:13.3f}")
    print(f"{'HF running our merges':28}{'':>9}{p['encode_mb_s']:13.2f}{p['encode_batch_mb_s']:12.2f}"
          f"{g['valid_bytes_per_token']:13.3f}")
    print(f"glassllm encode_corpus(valid.txt): {g['encode_corpus_mb_s']:.2f} MB/s; "
          f"warm cache: {g['encode_warm_cache_mb_s']:.2f} MB/s; "
          f"HF running our merges gives identical ids: {p['ids_identical']}")
    print(f"targets: train < 20 s: {'met' if g['train_s'] < 20 else 'MISSED'}; "
          f"encode >= 2 MB/s: {'met' if g['encode_mb_s'] >= 2 else 'MISSED'}")
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(results, indent=2) + "\n", encoding="utf-8")
        print(f"wrote {args.json}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
