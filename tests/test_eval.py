"""``glassllm eval``: the bytes it counts are the stories' own for every tokenizer; per-document scoring and its
position bands, checked against each document run through the model alone."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest

from glassllm.autograd import no_grad
from glassllm.checkpoint import load_bundled, load_model
from glassllm.cli import main
from tests.support.glassllm_testing import story_text

STORIES = ["Once upon a time, Tom had a red ball.\nHe gave it to Lily. \u201cThank you!\u201d she said.",
           "Mia saw a caf\u00e9 by the sea. She was happy \u2013 very happy.",
           "The sun was hot.\nBen ran to the big tree and sat down."]


def story_file(tmp_path, stories=STORIES):
    path = tmp_path / "stories.txt"
    path.write_text(story_text(stories), encoding="utf-8")
    return path


def run_eval(capsys, *args) -> dict:
    capsys.readouterr()
    assert main(["eval", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def alone_nats(model, ids) -> np.ndarray:
    """Nats of each next token of ``ids``, from one forward pass of that sequence alone (float64 log-softmax)."""
    with no_grad():
        z = model(np.array([ids[:-1]])).data[0].astype(np.float64)
    z = z - z.max(axis=-1, keepdims=True)
    logp = z - np.log(np.exp(z).sum(axis=-1, keepdims=True))
    return -logp[np.arange(len(ids) - 1), ids[1:]]


def test_bundled_model_counts_exactly_the_stories_bytes(tmp_path, capsys):
    data = story_file(tmp_path)
    want = sum(len(s.encode("utf-8")) for s in STORIES)
    model, tok, _ = load_bundled()
    windows = run_eval(capsys, "--data", str(data))
    docs = run_eval(capsys, "--data", str(data), "--per-document")
    assert windows["bytes"] == want and docs["bytes"] == want
    for r in (windows, docs):
        assert r["bits_per_byte"] == pytest.approx(r["nats"] / (math.log(2) * want), rel=1e-12)
    # Each story alone as the model reads it in a story file: <|endoftext|> "\n" story "\n" <|endoftext|>.
    eot = tok.eot_id
    seqs = [[eot] + tok.encode("\n" + s + "\n") + [eot] for s in STORIES]
    nats = sum(alone_nats(model, np.array(s)).sum() for s in seqs)
    assert docs["tokens"] == sum(len(s) - 1 for s in seqs) and docs["documents"] == 3
    assert docs["nats"] == pytest.approx(nats, rel=1e-5)
    # Windows read the whole file after <|endoftext|> "\n", so they predict one token more than the stories
    # alone (the "\n" after the start) and read the later stories with the earlier ones in view.
    assert windows["tokens"] == docs["tokens"] + 1
    assert [b["tokens"] for b in docs["bands"]] == [docs["tokens"], 0, 0, 0]


def test_position_bands_and_the_context_cut(tmp_path, capsys):
    model, tok, _ = load_bundled()
    long = " ".join(f"Tom saw {n} red birds in the big green tree by the lake." for n in range(40))
    data = story_file(tmp_path, [long, STORIES[1]])
    seq = np.array([tok.eot_id] + tok.encode("\n" + long + "\n") + [tok.eot_id])
    assert len(seq) - 1 > 400                                             # the long story reaches the last band
    per = alone_nats(model, seq[:513])                                  # at most 512 predictions
    short = alone_nats(model, np.array([tok.eot_id] + tok.encode("\n" + STORIES[1] + "\n") + [tok.eot_id]))
    docs = run_eval(capsys, "--data", str(data), "--per-document")
    bands = docs["bands"]
    assert [(b["first"], b["last"]) for b in bands] == [(0, 127), (128, 255), (256, 383), (384, 511)]
    n = len(per)
    assert [b["tokens"] for b in bands] == [128 + len(short), 128, 128, n - 384]
    assert bands[0]["loss"] == pytest.approx((per[:128].sum() + short.sum()) / (128 + len(short)), rel=1e-5)
    for b in bands[1:]:
        assert b["loss"] == pytest.approx(per[b["first"]:b["last"] + 1].mean(), rel=1e-5)
    # Each band beside the same documents' loss at positions 0-255: the first band is reached by both stories,
    # the later ones by the long story alone.
    same = docs["same_documents"]
    assert [(r["first"], r["documents"]) for r in same] == [(0, 2), (128, 1), (256, 1), (384, 1)]
    assert same[0]["loss"] == pytest.approx((per[:256].sum() + short.sum()) / (256 + len(short)), rel=1e-5)
    for r in same[1:]:
        assert r["reference"] == [0, 255] and r["loss"] == pytest.approx(per[:256].mean(), rel=1e-5)
    capsys.readouterr()
    assert main(["eval", "--data", str(data), "--per-document"]) == 0
    lines = capsys.readouterr().out.splitlines()
    assert f"the same 1 document at 0-255: {per[:256].mean():.4f}" in lines[3]
    assert f"{per[256:384].mean() / per[:256].mean() - 1:+.1%}" in lines[3]
    assert docs["truncated"] == (len(seq) - 1 > 512)
    cut = run_eval(capsys, "--data", str(data), "--per-document", "--seq-len", "100")
    assert cut["truncated"] == 1 and cut["context"] == 100
    assert cut["tokens"] == 100 + len(short)
    assert cut["nats"] == pytest.approx(per[:100].sum() + short.sum(), rel=1e-5)
    assert [b["tokens"] for b in cut["bands"]] == [cut["tokens"], 0, 0, 0]


def test_stories260k_shaped_gguf_counts_exactly_the_stories_bytes(tmp_path, capsys):
    pytest.importorskip("gguf")
    pytest.importorskip("sentencepiece")
    from tests.support.llama_fixtures import numpy_llama, train_sentencepiece, write_gguf

    sp = train_sentencepiece(tmp_path / "sp", vocab_size=512)
    gguf_file = write_gguf(numpy_llama(tmp_path / "hf", sp), sp, tmp_path / "stories260K.gguf")
    out = tmp_path / "m.safetensors"
    assert main(["import", str(gguf_file), str(out)]) == 0
    model, tok, _ = load_model(out)
    assert (model.config.dim, model.config.n_layers, model.config.max_seq_len) == (64, 5, 512)
    data = story_file(tmp_path)
    want = sum(len(s.encode("utf-8")) for s in STORIES)
    windows = run_eval(capsys, "--model", str(out), "--data", str(data))
    docs = run_eval(capsys, "--model", str(out), "--data", str(data), "--per-document")
    assert windows["bytes"] == want and docs["bytes"] == want
    assert windows["seq_len"] == 512                                     # the context the file gives
    # <s> story, then the next <s> (the end) predicted: as many predictions as encode_prompt gives ids.
    seqs = [tok.encode_prompt(s) + [tok.bos_id] for s in STORIES]
    assert docs["tokens"] == sum(len(s) - 1 for s in seqs)
    assert docs["nats"] == pytest.approx(sum(alone_nats(model, np.array(s)).sum() for s in seqs), rel=1e-5)
    assert windows["tokens"] == docs["tokens"] - 1                      # no <s> after the last story in the file
