"""``glassllm eval``: the bytes it counts are the stories' own for every tokenizer; per-document scoring and its
position bands, checked against each document run through the model alone."""

from __future__ import annotations

import json
import math
import os

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


def test_no_bits_per_byte_without_a_byte_scored(tmp_path, capsys):
    """A figure needs bytes: a text of separators alone, or a per-document context that reaches none of
    any story's text, is refused in one line, the same way in both modes."""
    data = story_file(tmp_path)
    capsys.readouterr()
    assert main(["eval", "--data", str(data), "--per-document", "--seq-len", "1", "--json"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.count("\n") == 1
    assert "error: --seq-len must be > 1 for this text: predicting 1 token of each document scores none" in err
    assert run_eval(capsys, "--data", str(data), "--per-document", "--seq-len", "2")["bytes"] > 0
    assert run_eval(capsys, "--data", str(data), "--seq-len", "1")["bytes"] == sum(len(s.encode()) for s in STORIES)
    for text in ("<|endoftext|>\n", "<|endoftext|>\n<|endoftext|>\n", "\n<|endoftext|>\n\n<|endoftext|>\n", ""):
        (tmp_path / "sep.txt").write_text(text, encoding="utf-8")
        errors = []
        for mode in ([], ["--per-document"]):
            assert main(["eval", "--data", str(tmp_path / "sep.txt"), *mode, "--json"]) == 2, (text, mode)
            out, err = capsys.readouterr()
            assert out == "" and err.count("\n") == 1
            errors.append(err)
        assert errors[0] == errors[1] and "the text holds no document to score" in errors[0]
        assert "give text with at least one story" in errors[0]
    # An empty story between two: its lone newline is the separator's, so both modes count the stories' bytes.
    gap = tmp_path / "gap.txt"
    gap.write_text("Tom ran.\n<|endoftext|>\n<|endoftext|>\nMia sat.\n<|endoftext|>\n", encoding="utf-8")
    assert run_eval(capsys, "--data", str(gap))["bytes"] == 16
    assert run_eval(capsys, "--data", str(gap), "--per-document")["bytes"] == 16


def test_the_api_refuses_bits_per_byte_from_no_bytes():
    from glassllm.checks import ParameterError
    from glassllm.train.evaluate import evaluate, evaluate_documents, evaluate_text

    model, tok, _ = load_bundled()
    head = [tok.eot_id] + tok.encode("\n")
    with pytest.raises(ValueError, match="no document to score"):
        evaluate(model, np.array(head * 3), tok, seq_len=4)
    with pytest.raises(ValueError, match="no document to score"):
        evaluate_text(model, tok, "<|endoftext|>\n", from_start=True)
    ids = np.array(head * 2 + tok.encode("Tom ran."))
    with pytest.raises(ParameterError, match="max_windows must be > 1 for this text") as e:
        evaluate(model, ids, tok, seq_len=2, max_windows=1)
    assert e.value.param == "max_windows"
    assert evaluate(model, ids, tok, seq_len=2, max_windows=3).bytes > 0
    with pytest.raises(ParameterError, match="context must be > 1 for this text") as e:
        evaluate_documents(model, tok, story_text(STORIES), context=1)
    assert e.value.param == "context"


@pytest.mark.parametrize("special", ["/dev/null", "fifo"])
def test_a_data_path_that_is_not_a_file_or_folder(tmp_path, capsys, special):
    if special == "fifo":
        if not hasattr(os, "mkfifo"):
            pytest.skip("no FIFOs here")
        special = str(tmp_path / "pipe.txt")
        os.mkfifo(special)
    elif not os.path.exists(special):
        pytest.skip("no /dev/null here")
    capsys.readouterr()
    assert main(["eval", "--data", special]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "does not exist" not in err
    assert (f"data path {special!r} is not a regular file or folder (a device, a pipe or a socket): "
            "expected a text file or a folder of .txt files") in err
