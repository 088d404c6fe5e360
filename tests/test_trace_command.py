"""``glassllm trace`` and ``glassllm snapshots``: the numbers printed are the tracer's, rounded."""

from __future__ import annotations

import json

import numpy as np
import pytest

from glassllm import checkpoint, cli
from glassllm.trace import trace
from glassllm.trace.explain import equation, sites
from glassllm.trace.registry import generic_names

PROMPT = "The cat sat"


@pytest.fixture(scope="module")
def bundled():
    model, tokenizer, _ = checkpoint.load_model(checkpoint.bundled_model_path())
    return model, tokenizer


def _run(capsys, *argv):
    code = cli.main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _table(out: str, n_rows: int):
    """The matrix rows of the printed view: (row label, cells, row sum)."""
    lines = [line for line in out.splitlines() if line[:1].isdigit()]
    assert len(lines) == n_rows, out
    rows = []
    for line in lines:
        parts = line.split()
        rows.append((parts[1], parts[2:-1], parts[-1]))
    return rows


def test_the_matrix_is_the_traced_one_rounded_with_tokens_and_masked_cells(capsys, bundled):
    model, tokenizer = bundled
    tokens = tokenizer.encode_prompt(PROMPT)
    want = trace(model, tokens).get("attn.softmax", layer=0, head=1)
    code, out, err = _run(capsys, "trace", PROMPT, "--snapshot", "attn.softmax", "--layer", "0", "--head", "1")
    assert code == 0, err
    assert equation("attn.softmax")["text"] in out
    site = sites()["layers.{i}.attn.softmax"]
    assert f"glassllm/nn.py:{site.line}" in out
    n = len(tokens)
    pieces = [p.replace(" ", "␣") for p in tokenizer.pieces(tokens)]
    for i, (label, cells, total) in enumerate(_table(out, n)):
        assert label == pieces[i]
        for j, cell in enumerate(cells):
            if j > i:
                assert cell == "·"                                   # the causal mask
            else:
                assert float(cell) == pytest.approx(round(float(want[i, j]), 3), abs=1e-9)
        assert float(total) == pytest.approx(round(float(want[i].sum()), 3), abs=1e-9)
    header = out.splitlines()[4]
    assert header.split() == pieces                                   # keys across


def test_a_feature_matrix_shows_its_first_columns_and_the_sum_over_all(capsys, bundled):
    model, tokenizer = bundled
    tokens = tokenizer.encode_prompt(PROMPT)
    want = trace(model, tokens).get("layers.2.mlp.act")
    code, out, _ = _run(capsys, "trace", PROMPT, "--snapshot", "layers.2.mlp.act", "--max-columns", "5",
                        "--decimals", "4")
    assert code == 0
    for i, (_, cells, total) in enumerate(_table(out, len(tokens))):
        assert [float(c) for c in cells[:5]] == [round(float(v), 4) for v in want[i, :5]] and cells[5] == "…"
        assert float(total) == pytest.approx(round(float(want[i].astype(np.float64).sum()), 4), abs=1e-9)


def test_json_and_npy(capsys, bundled, tmp_path):
    model, tokenizer = bundled
    tokens = tokenizer.encode_prompt(PROMPT)
    want = trace(model, tokens).get("attn.k", layer=1, head=0)         # every layer's reference code
    path = tmp_path / "k.npy"
    code, out, _ = _run(capsys, "trace", PROMPT, "--snapshot", "attn.k", "--layer", "1", "--head", "0",
                        "--json", "--npy", str(path))
    assert code == 0
    doc = json.loads(out)
    assert doc["name"] == "layers.1.attn.k" and doc["layer"] == 1 and doc["head"] == 0
    assert doc["shape"] == list(want.shape) and doc["tokens"] == tokenizer.pieces(tokens)
    np.testing.assert_array_equal(np.array(doc["values"], dtype=want.dtype), want)
    np.testing.assert_array_equal(np.load(path), want)
    # The inspector's numbers for the same view, to the last bit (what a learner compares when hovering).
    from glassllm.inspector import Inspector
    from glassllm.inspector.schema import SnapshotRequest
    from tests.test_inspector_api import decode_array

    view = Inspector(model, tokenizer).snapshot(SnapshotRequest(prompt=PROMPT, name="attn.softmax", layer=1, head=2))
    code, out, _ = _run(capsys, "trace", PROMPT, "--snapshot", "attn.softmax", "--layer", "1", "--head", "2", "--json")
    np.testing.assert_array_equal(np.array(json.loads(out)["values"], dtype=np.float32), decode_array(view["values"]))
    # A negative layer and head count from the end, and are named by the index they stand for.
    code, out, _ = _run(capsys, "trace", PROMPT, "--snapshot", "attn.k", "--layer", "-1", "--head", "-1", "--json")
    doc = json.loads(out)
    assert code == 0 and doc["name"] == "layers.3.attn.k" and doc["head"] == model.config.n_kv_heads - 1
    code, out, _ = _run(capsys, "trace", PROMPT, "--snapshot", "attn.softmax", "--layer", "-1", "--head", "-1")
    assert code == 0 and out.startswith(f"layers.3.attn.softmax, head {model.config.n_heads - 1} ")


@pytest.mark.parametrize("argv, words", [
    (["--snapshot", "attn.softmax", "--head", "1"], "--layer 0..3"),
    (["--snapshot", "attn.softmax", "--layer", "0"], "--head 0..3"),
    (["--snapshot", "logits", "--head", "0"], "no head axis"),
    (["--snapshot", "attn.sofmax", "--layer", "0"], "attn.sofmax"),
    (["--snapshot", "attn.softmax", "--layer", "9", "--head", "0"], "layer 9"),
    (["--snapshot", "attn.softmax", "--layer", "0", "--head", "7"], "7"),
    (["--snapshot", "logits", "--decimals", "40"], "--decimals"),
    (["", "--snapshot", "embed"], "prompt is empty: give at least one character"),
])
def test_bad_input_is_one_line_and_exit_2(capsys, argv, words):
    prompt = [] if argv[0] == "" else [PROMPT]                        # an empty prompt is the one given
    code, out, err = _run(capsys, "trace", *prompt, *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and words in err and "Traceback" not in err


def test_snapshots_lists_every_name_with_shape_and_equation(capsys):
    code, out, _ = _run(capsys, "snapshots")
    assert code == 0
    lines = out.splitlines()
    names = generic_names()
    assert [line.split()[0] for line in lines] == [g for g, *_ in names]
    for line, (g, *_rest) in zip(lines, names):
        assert line.endswith(equation(g)["text"])
    assert "(H=4, n, m)" in lines[[g for g, *_ in names].index("layers.{i}.attn.scores")]
