"""Generation: KV-cache decoding, stopping, batching, the lean path and the CLI.

References: decoding that recomputes the whole sequence at every step (no
cache) for the tokens; the module path for the lean NumPy path; each prompt
decoded alone for a batch. Models have random weights of a trained-like scale
(conftest.randomize), so logits spread over several units and greedy choices
are not near-ties.
"""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

from tests.support.glassllm_testing import CONFIGS, randomize
from glassllm.autograd import no_grad
from glassllm.checkpoint import save_model
from glassllm.cli import main
from glassllm.config import ModelConfig
from glassllm.kernels import FastDecoder
from glassllm.generate import Token, generate, generate_batch, generate_text
from glassllm.nn import Transformer
from glassllm.sampling import model_probs

NAMES = ["Tom", "Lily", "Ben", "Mia", "Sam", "Anna"]
THINGS = ["ball", "cat", "tree", "cake", "boat", "dog", "hat"]
VERBS = ["saw", "liked", "found", "lost", "made", "wanted"]


def tiny_corpus(n: int = 300) -> list[str]:
    rng = np.random.default_rng(0)
    return [f"{rng.choice(NAMES)} {rng.choice(VERBS)} a {rng.choice(THINGS)}. It was big and "
            f"{rng.choice(['red', 'happy', 'soft', 'fun'])}. {rng.choice(NAMES)} said, \"Wow!\" The end."
            for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer():
    from glassllm.tokenizer import Tokenizer
    return Tokenizer.train(tiny_corpus(), vocab_size=320)


SMALL = ModelConfig(vocab_size=320, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=128, max_seq_len=96)


def small_model(dtype=np.float64, seed=0) -> Transformer:
    return randomize(Transformer(SMALL, seed=seed, dtype=dtype), np.random.default_rng(seed + 1))


@pytest.fixture(scope="module")
def model64():
    return small_model(np.float64)


@pytest.fixture(scope="module")
def model_file(tmp_path_factory, tokenizer):
    path = tmp_path_factory.mktemp("gen") / "small.safetensors"
    save_model(path, small_model(np.float32), tokenizer)
    return path


def recompute_greedy(model: Transformer, prompt: list[int], steps: int) -> tuple[list[int], list[float]]:
    """Greedy decoding without a cache: the whole sequence goes through the model every step."""
    seq, probs = list(prompt), []
    with no_grad():
        for _ in range(steps):
            logits = model(np.array([seq])).data[0, -1]                  # (V,)
            i = int(logits.argmax())
            probs.append(float(model_probs(logits)[i]))
            seq.append(i)
    return seq[len(prompt):], probs


# ----------------------------------------------------------------------------
# Acceptance 1: the cache changes nothing
# ----------------------------------------------------------------------------

# The full 1,024-way vocabulary and GQA, but narrow, so that 200 uncached forward
# passes of up to 208 positions stay cheap. (The lean path is checked on the
# default shape in test_fast_decoder_equals_module_path.)
LONG = ModelConfig(vocab_size=1024, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=256)


@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_cached_greedy_equals_recomputing_greedy_for_200_tokens(dtype):
    model = randomize(Transformer(LONG, seed=0, dtype=dtype), np.random.default_rng(1))
    prompt = [5, 17, 300, 2, 999, 64, 1000, 7]
    expected, expected_p = recompute_greedy(model, prompt, 200)
    tol = 1e-9 if dtype == np.float64 else 2e-4
    for fast in (False, True):  # the module path and the lean path, both with the cache
        records = list(generate(model, None, prompt, max_new_tokens=200, temperature=0, fast=fast))
        assert [t.id for t in records] == expected
        np.testing.assert_allclose([t.prob for t in records], expected_p, rtol=tol)
    # The spec's start / n / m: prefill once with n = L, then n = 1 against m = start + 1 keys.
    L = len(prompt)
    assert (records[0].start, records[0].n, records[0].m) == (0, L, L)
    for s, t in enumerate(records[1:], start=1):
        assert (t.step, t.start, t.n, t.m) == (s, L + s - 1, 1, L + s)


# ----------------------------------------------------------------------------
# The lean path equals the module path
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("name", ["default", "gqa3", "mqa", "mha"])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_fast_decoder_equals_module_path(name, dtype):
    config = CONFIGS[name]
    model = randomize(Transformer(config, seed=3, dtype=dtype), np.random.default_rng(4))
    lean = FastDecoder(model)
    rng = np.random.default_rng(5)
    tol = dict(rtol=1e-12, atol=1e-12) if dtype == np.float64 else dict(rtol=1e-5, atol=2e-5)
    for pad in (None, np.array([0, 3, 5])):
        a, b = model.new_cache(3, pad=pad), model.new_cache(3, pad=pad)
        tokens = rng.integers(0, config.vocab_size, size=(3, 9))
        with no_grad():
            for n in (9, 1, 1, 4, 1):   # prefill, steps, a chunk, a step
                expected = model(tokens[:, :n], a).data[:, -1]          # (B, V)
                got = lean(tokens[:, :n], b)
                np.testing.assert_allclose(got, expected, **tol)
                np.testing.assert_allclose(b.k, a.k, **tol)
                np.testing.assert_allclose(b.v, a.v, **tol)
                assert a.start == b.start
                tokens = rng.integers(0, config.vocab_size, size=(3, 9))


def test_tracer_sees_every_forward_and_forces_the_module_path(teaching_tracer):
    model = small_model()
    plain = [t.id for t in generate(model, None, [1, 2, 3, 4], max_new_tokens=6, temperature=0.9, seed=1)]
    model.set_tracer(teaching_tracer)
    try:
        traced = [t.id for t in generate(model, None, [1, 2, 3, 4], max_new_tokens=6, temperature=0.9, seed=1)]
        with pytest.raises(ValueError, match="tracer"):
            generate(model, None, [1, 2], fast=True)
    finally:
        model.set_tracer(None)
    assert traced == plain
    seen = [(f["n"], f["m"], f["start"]) for f in teaching_tracer.forwards]
    assert seen == [(4, 4, 0)] + [(1, 4 + s, 3 + s) for s in range(1, 6)]
    assert "layers.0.attn.softmax" in teaching_tracer.seen


def test_generation_under_the_real_tracer_records_prefill_then_single_steps(model64, tokenizer):
    from glassllm.trace import Tracer

    prompt = tokenizer.encode("Lily found")
    L = len(prompt)
    plain = list(generate(model64, tokenizer, prompt, max_new_tokens=5, temperature=0.8, seed=3))
    with Tracer(model64, names=["logits", "attn.softmax"]) as tracer:
        traced = list(generate(model64, tokenizer, prompt, max_new_tokens=5, temperature=0.8, seed=3))
    steps = tracer.trace.steps
    assert [t.id for t in traced] == [t.id for t in plain]
    # The last token is drawn but never fed back: 5 tokens, 5 forwards.
    assert [(s.n, s.m, s.start) for s in steps] == [(L, L, 0)] + [(1, L + k, L + k - 1) for k in range(1, 5)]
    for t, s in zip(traced, steps):
        assert (t.n, t.m, t.start) == (s.n, s.m, s.start)
        assert t.prob == pytest.approx(model_probs(s.values["logits"][-1])[t.id], rel=1e-9)
        assert s.values["layers.1.attn.softmax"].shape == (SMALL.n_heads, s.n, s.m)


# ----------------------------------------------------------------------------
# Acceptance 2: seeds
# ----------------------------------------------------------------------------

def test_same_seed_same_text_different_seed_different_text(model64, tokenizer):
    def text(seed):
        return generate_text(model64, tokenizer, "Tom saw a", max_new_tokens=40, temperature=1.0, seed=seed)

    assert text(7) == text(7)
    texts = {text(s) for s in range(5)}
    assert len(texts) == 5
    rng_a, rng_b = np.random.default_rng(7), np.random.default_rng(7)
    assert generate_text(model64, tokenizer, "Tom", max_new_tokens=20, seed=rng_a) == \
        generate_text(model64, tokenizer, "Tom", max_new_tokens=20, seed=rng_b) == \
        generate_text(model64, tokenizer, "Tom", max_new_tokens=20, seed=7)


def test_sampled_tokens_carry_their_probabilities(model64):
    records = list(generate(model64, None, [3, 4, 5], max_new_tokens=5, temperature=0.7, top_k=10,
                            top_p=0.9, seed=2, alternatives=4))
    seq = [3, 4, 5]
    with no_grad():
        for t in records:
            p = model_probs(model64(np.array([seq])).data[0, -1])
            assert t.prob == pytest.approx(p[t.id], rel=1e-9)
            assert 0 < t.prob <= 1 and 0 < t.p_sampled <= 1
            best = np.argsort(-p, kind="stable")[:4]
            assert [i for i, _ in t.top] == best.tolist()
            np.testing.assert_allclose([q for _, q in t.top], p[best], rtol=1e-9)
            seq.append(t.id)


# ----------------------------------------------------------------------------
# Batches
# ----------------------------------------------------------------------------

@pytest.mark.parametrize("temperature", [0.0, 1.0])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_batch_equals_each_prompt_alone(temperature, dtype, tokenizer):
    model = small_model(dtype)
    prompts = ["Tom", "Lily found a big red", [1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13]]
    kw = dict(max_new_tokens=25, temperature=temperature, top_k=50 if temperature else None)
    batch = list(generate_batch(model, tokenizer, prompts, seed=10, **kw))
    for b, prompt in enumerate(prompts):
        alone = list(generate(model, tokenizer, prompt, seed=10 + b, **kw))
        mine = [t for t in batch if t.row == b]
        assert [(t.id, t.text, t.step, t.n, t.start, t.m, t.finish) for t in mine] == \
               [(t.id, t.text, t.step, t.n, t.start, t.m, t.finish) for t in alone]
        np.testing.assert_allclose([t.prob for t in mine], [t.prob for t in alone],
                                   rtol=1e-9 if dtype == np.float64 else 1e-4)


def test_batch_rows_stop_independently(tokenizer):
    model = small_model()
    stop = generate_text(model, tokenizer, "Ben", max_new_tokens=12, temperature=0)[3:6]
    records = list(generate_batch(model, tokenizer, ["Ben", "Mia"], max_new_tokens=12, temperature=0,
                                  stop=stop))
    ben = [t for t in records if t.row == 0]
    assert ben[-1].finish == "stop" and len(ben) < 12
    assert [t.step for t in records if t.row == 1] == list(range(len([t for t in records if t.row == 1])))


# ----------------------------------------------------------------------------
# Stopping
# ----------------------------------------------------------------------------

def test_max_new_tokens_stops_with_length(model64):
    records = list(generate(model64, None, [1, 2], max_new_tokens=7, temperature=0))
    assert len(records) == 7
    assert [t.finish for t in records] == [None] * 6 + ["length"]


def test_stop_string_is_included_and_ends_the_text(model64, tokenizer):
    full = generate_text(model64, tokenizer, "Mia liked", max_new_tokens=40, temperature=0)
    stop = full[12:15]
    assert full.count(stop) >= 1
    records = list(generate(model64, tokenizer, "Mia liked", max_new_tokens=40, temperature=0, stop=[stop]))
    text = "".join(t.text for t in records)
    assert records[-1].finish == "stop"
    assert stop in text and full.startswith(text)
    assert stop not in "".join(t.text for t in records[:-1])  # it stopped at the first occurrence
    # A stop string only in the prompt does not stop anything.
    assert len(list(generate(model64, tokenizer, "Mia liked", max_new_tokens=5, stop="liked"))) == 5


def test_end_of_text_stops_and_is_yielded(tokenizer):
    model = small_model()
    prompt = tokenizer.encode("Sam made a")
    ids = [t.id for t in generate(model, tokenizer, prompt, max_new_tokens=10, temperature=0)]
    # Make the model say <|endoftext|> where it said the 4th token: swap the two output rows.
    s = next(i for i in range(3, 10) if ids[i] not in ids[:i])
    w = model.output.weight.data
    w[[ids[s], tokenizer.eot_id]] = w[[tokenizer.eot_id, ids[s]]]
    records = list(generate(model, tokenizer, prompt, max_new_tokens=10, temperature=0))
    assert [t.id for t in records[:s]] == ids[:s]
    assert records[-1].id == tokenizer.eot_id and records[-1].finish == "eot"
    assert records[-1].text == "" and records[-1].piece == "<|endoftext|>" and len(records) == s + 1


def test_text_streams_whole_characters(tokenizer):
    # A random model at T = 1 draws many lone bytes >= 0x80: a byte that starts a
    # character adds "", the one completing it adds the character, and a broken
    # sequence becomes U+FFFD -- exactly as decoding all the ids at once does.
    model = small_model()
    partial = 0
    for seed in range(3):
        records = list(generate(model, tokenizer, "é", max_new_tokens=30, temperature=1.0, seed=seed))
        ids = [t.id for t in records if t.id != tokenizer.eot_id]
        assert "".join(t.text for t in records) == tokenizer.decode(ids)
        partial += sum(t.text == "" and t.finish != "eot" for t in records)
    assert partial > 0


# ----------------------------------------------------------------------------
# Context policy: an error before any work
# ----------------------------------------------------------------------------

def test_overflowing_the_context_is_an_error_before_any_work(model64):
    ctx = SMALL.max_seq_len
    prompt = list(range(10))
    with pytest.raises(ValueError, match="exceeds the context of 96"):
        generate(model64, None, prompt, max_new_tokens=ctx - 9)      # raised at the call, not at next()
    records = list(generate(model64, None, prompt, max_new_tokens=ctx - 10, temperature=0))
    assert len(records) == ctx - 10 and records[-1].m == ctx - 1    # the last token is never fed back
    with pytest.raises(ValueError, match="longest prompt"):
        generate_batch(model64, None, [[1], prompt], max_new_tokens=ctx - 9)


# ----------------------------------------------------------------------------
# Acceptance 4: bad parameters give one line
# ----------------------------------------------------------------------------

BAD_CALLS = {
    "empty prompt": dict(prompt=""),
    "empty ids": dict(prompt=[]),
    "id out of range": dict(prompt=[1, 320]),
    "negative id": dict(prompt=[-1]),
    "float ids": dict(prompt=[1.0, 2.0]),
    "bool ids": dict(prompt=[True, False]),
    "bytes prompt": dict(prompt=b"Tom"),
    "none prompt": dict(prompt=None),
    "nested ids": dict(prompt=[[1, 2]]),
    "max 0": dict(max_new_tokens=0),
    "max negative": dict(max_new_tokens=-5),
    "max float": dict(max_new_tokens=10.0),
    "max bool": dict(max_new_tokens=True),
    "max str": dict(max_new_tokens="10"),
    "max none": dict(max_new_tokens=None),
    "temperature nan": dict(temperature=float("nan")),
    "temperature inf": dict(temperature=float("inf")),
    "temperature negative": dict(temperature=-1.0),
    "temperature str": dict(temperature="0.5"),
    "temperature none": dict(temperature=None),
    "top_k 0": dict(top_k=0),
    "top_k > V": dict(top_k=321),
    "top_k float": dict(top_k=5.5),
    "top_k nan": dict(top_k=float("nan")),
    "top_p 0": dict(top_p=0.0),
    "top_p > 1": dict(top_p=1.01),
    "top_p nan": dict(top_p=float("nan")),
    "top_p inf": dict(top_p=float("inf")),
    "top_p str": dict(top_p="high"),
    "seed negative": dict(seed=-1),
    "seed str": dict(seed="abc"),
    "seed float": dict(seed=1.5),
    "stop empty": dict(stop=""),
    "stop int": dict(stop=5),
    "alternatives negative": dict(alternatives=-1),
    "fast str": dict(fast="yes"),
    "overflow": dict(prompt=list(range(50)), max_new_tokens=47),
}


@pytest.mark.parametrize("case", list(BAD_CALLS))
def test_bad_parameters_raise_one_line_value_errors(case, model64, tokenizer):
    kwargs = dict(prompt="Tom", max_new_tokens=5) | BAD_CALLS[case]
    prompt = kwargs.pop("prompt")
    with pytest.raises(ValueError) as e:
        generate(model64, tokenizer, prompt, **kwargs)
    assert "\n" not in str(e.value) and len(str(e.value)) < 200


def test_model_tokenizer_and_prompt_kinds_are_checked(model64, tokenizer):
    from glassllm.tokenizer import Tokenizer

    with pytest.raises(ValueError, match="Transformer"):
        generate("model.safetensors", tokenizer, "Tom")
    other = Tokenizer.train(tiny_corpus(50), vocab_size=300)
    with pytest.raises(ValueError, match="tokenizer has 300 ids"):
        generate(model64, other, "Tom")
    with pytest.raises(ValueError, match="no tokenizer"):
        generate(model64, None, "Tom")
    with pytest.raises(ValueError, match="stop strings need a tokenizer"):
        generate(model64, None, [1], stop="x")


def test_whitespace_prompt_is_used_as_it_is(model64, tokenizer):
    records = list(generate(model64, tokenizer, "   ", max_new_tokens=3, temperature=0))
    assert records[0].n == len(tokenizer.encode("   ")) and len(records) == 3


def test_endoftext_in_a_prompt_is_the_special_token(model64, tokenizer):
    records = list(generate(model64, tokenizer, "<|endoftext|>", max_new_tokens=2, temperature=0))
    assert records[0].n == 1
    by_id = list(generate(model64, tokenizer, [tokenizer.eot_id], max_new_tokens=2, temperature=0))
    assert [t.id for t in records] == [t.id for t in by_id]


def test_records_are_frozen(model64):
    t = next(iter(generate(model64, None, [1], max_new_tokens=1)))
    assert isinstance(t, Token)
    with pytest.raises(Exception):
        t.id = 3


# ----------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------

def test_cli_streams_the_prompt_and_its_continuation(model_file, tokenizer, capsys):
    from glassllm.checkpoint import load_model

    code = main(["generate", "Tom saw", "--model", str(model_file), "--max-new-tokens", "12",
                 "--temperature", "0.8", "--top-k", "40", "--top-p", "0.95", "--seed", "4"])
    out = capsys.readouterr().out
    model, tok, _ = load_model(model_file)
    expected = generate_text(model, tok, "Tom saw", max_new_tokens=12, temperature=0.8, top_k=40,
                             top_p=0.95, seed=4)
    assert code == 0 and out == "Tom saw" + expected + "\n"


def test_cli_show_probs(model_file, capsys):
    code = main(["generate", "Lily", "--model", str(model_file), "--max-new-tokens", "4", "--temperature", "0",
                 "--show-probs"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0
    rows = [line for line in lines if line[:4].strip().isdigit()]
    assert len(rows) == 4 and lines[-1] == "[stopped: length]"
    assert all("0." in row for row in rows)


def test_cli_show_probs_gives_the_models_probability_and_the_drawn_ones(model_file, capsys):
    """Under --top-k the two differ: p(model) is the softmax of the logits, p(drawn) the filtered distribution's."""
    from glassllm.checkpoint import load_model

    code = main(["generate", "Lily", "--model", str(model_file), "--max-new-tokens", "4", "--top-k", "3",
                 "--seed", "2", "--show-probs"])
    lines = capsys.readouterr().out.splitlines()
    assert code == 0 and "p(model) p(drawn)" in lines[1]
    model, tok, _ = load_model(model_file)
    records = list(generate(model, tok, "Lily", max_new_tokens=4, top_k=3, seed=2, alternatives=5))
    rows = [line for line in lines if line[:4].strip().isdigit()]
    for row, t in zip(rows, records, strict=True):
        assert f" {t.prob:>8.4f} {t.p_sampled:>8.4f}  " in row
    assert any(t.p_sampled > t.prob for t in records)                  # filtering renormalised the kept ids


def test_cli_default_length_fits_a_short_context(model_file, capsys):
    """No --max-new-tokens on a model whose context is under 200 + the prompt: as many tokens as fit."""
    from glassllm.checkpoint import load_model

    model, tok, _ = load_model(model_file)
    assert model.config.max_seq_len < 200
    code = main(["generate", "Lily", "--model", str(model_file), "--temperature", "0", "--show-probs"])
    out = capsys.readouterr().out
    rows = [line for line in out.splitlines() if line[:4].strip().isdigit()]
    room = model.config.max_seq_len - len(tok.encode("Lily"))
    assert code == 0, out
    assert len(rows) == room and out.splitlines()[-1] == "[stopped: length]" or \
        len(rows) < room and out.splitlines()[-1] == "[stopped: eot]", out[-300:]


@pytest.mark.parametrize("args", [
    ["--temperature", "nan"], ["--temperature", "-1"], ["--temperature", "inf"], ["--top-k", "0"],
    ["--top-k", "100000"], ["--top-p", "0"], ["--top-p", "1.5"], ["--max-new-tokens", "0"],
    ["--max-new-tokens", "5000"], ["--seed", "-3"], ["--stop", ""],
])
def test_cli_bad_options_exit_2_with_one_line(args, model_file, capsys):
    code = main(["generate", "Tom", "--model", str(model_file), *args])
    err = capsys.readouterr().err
    assert code == 2
    assert len(err.strip().splitlines()) == 1 and err.startswith("glassllm generate: error:")


def test_cli_bad_inputs_exit_2(model_file, tmp_path, capsys, monkeypatch):
    cases = [
        ["generate", "", "--model", str(model_file)],
        ["generate", "Tom", "--model", str(tmp_path / "nope.safetensors")],
        ["generate", "Tom", "--model", str(tmp_path)],
    ]
    junk = tmp_path / "junk.safetensors"
    junk.write_text("not a model")
    cases.append(["generate", "Tom", "--model", str(junk)])
    for argv in cases:
        assert main(argv) == 2
        err = capsys.readouterr().err
        assert len(err.strip().splitlines()) == 1 and err.startswith("glassllm generate: error:")

    import glassllm.checkpoint as checkpoint
    monkeypatch.setattr(checkpoint, "bundled_model_path", lambda: tmp_path / "missing.safetensors")
    assert main(["generate", "Tom"]) == 2
    err = capsys.readouterr().err
    assert "bundled model" in err and "--model" in err and len(err.strip().splitlines()) == 1


def test_cli_argparse_errors_exit_2(model_file):
    with pytest.raises(SystemExit) as e:
        main(["generate", "Tom", "--model", str(model_file), "--top-k", "abc"])
    assert e.value.code == 2


def test_cli_entry_point_in_a_subprocess(model_file):
    ok = subprocess.run([sys.executable, "-m", "glassllm.cli", "generate", "Ben", "--model", str(model_file),
                         "--max-new-tokens", "5", "--temperature", "0"], capture_output=True, text=True)
    assert ok.returncode == 0 and ok.stdout.startswith("Ben")
    bad = subprocess.run([sys.executable, "-m", "glassllm.cli", "generate", "Ben", "--model", str(model_file),
                          "--temperature", "nan"], capture_output=True, text=True)
    assert bad.returncode == 2 and bad.stderr.count("\n") == 1 and "temperature" in bad.stderr


# ----------------------------------------------------------------------------
# Alternatives, top-p and temperature at their edges; a long prefill; an interrupted CLI
# ----------------------------------------------------------------------------

def test_alternatives_break_ties_toward_the_lower_id():
    from glassllm.generate import _top

    assert [i for i, _ in _top(np.full(600, 1 / 600), 3)] == [0, 1, 2]
    probs = np.array([0.1, 0.3, 0.1, 0.3, 0.2])
    assert _top(probs, 4) == ((1, 0.3), (3, 0.3), (4, 0.2), (0, 0.1))


def test_top_p_keeps_the_smallest_set_that_reaches_p_despite_rounding():
    from glassllm.sampling import sampling_distribution

    # Ten equal ids: the running sum after eight is 0.7999999999999999 in floats; eight reach 0.8.
    for p, kept in ((0.8, 8), (0.9, 9), (0.85, 9), (1.0, 10)):
        assert (sampling_distribution(np.zeros(10), 1.0, top_p=p) > 0).sum() == kept, p


def test_a_tiny_temperature_is_greedy_without_a_warning():
    import warnings

    from glassllm.sampling import sampling_distribution

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        dist = sampling_distribution(np.array([0.5, 2.0, -1.0]), 1e-310)
    assert dist.tolist() == [0.0, 1.0, 0.0]


def test_a_long_prefill_goes_through_the_tiled_kernel():
    """n >= FLASH_MIN_QUERIES: the lean decoder hands the prefill to the module path, whose tiled
    kernel holds no (n, m) score matrices -- so the logits are the module path's to the bit, where a
    shorter prefill, computed the lean way, differs from it in rounding."""
    import dataclasses

    config = dataclasses.replace(SMALL, max_seq_len=256)
    model64 = randomize(Transformer(config, seed=0, dtype=np.float64), np.random.default_rng(1))
    tokens = np.random.default_rng(5).integers(0, SMALL.vocab_size, (4, 140))
    ref_cache, lean_cache = model64.new_cache(4), model64.new_cache(4)
    with no_grad():
        want = model64(tokens, ref_cache).data[:, -1]
    lean = FastDecoder(model64)
    got = lean(tokens, lean_cache)
    np.testing.assert_array_equal(got, want)
    np.testing.assert_array_equal(lean_cache.k, ref_cache.k)
    assert lean_cache.start == 140
    short = tokens[:, :100]                                              # below the threshold: the lean way
    with no_grad():
        want_short = model64(short, model64.new_cache(4)).data[:, -1]
    got_short = lean(short, model64.new_cache(4))
    np.testing.assert_allclose(got_short, want_short, rtol=1e-10, atol=1e-12)
    assert not np.array_equal(got_short, want_short)


def test_an_interrupted_generate_ends_its_line(model_file, monkeypatch, capsys):
    import glassllm.generate as gen

    real = gen.generate

    def cut_short(*args, **kwargs):
        for i, t in enumerate(real(*args, **kwargs)):
            if i == 3:
                raise KeyboardInterrupt
            yield t

    monkeypatch.setattr(gen, "generate", cut_short)
    assert main(["generate", "Tom", "--model", str(model_file), "--max-new-tokens", "10"]) == 130
    out, err = capsys.readouterr()
    assert out.startswith("Tom") and out.endswith("\n") and err == "glassllm generate: interrupted\n"


def test_cli_show_probs_quotes_a_piece_with_an_apostrophe_as_python_would(capsys):
    """'s is printed "'s", not ''s': each piece in the table reads back as the str it is."""
    import ast

    from glassllm.commands.generate import quoted

    for piece in ["'s", " cat", ' "', "'\"", "it's"]:
        assert ast.literal_eval(quoted(piece)) == piece
    from glassllm.checkpoint import bundled_model_path

    if not bundled_model_path().exists():
        pytest.skip("needs the bundled model")
    assert main(["generate", "Lily went to her mom", "--temperature", "0", "--max-new-tokens", "1",
                 "--show-probs"]) == 0
    row = capsys.readouterr().out.splitlines()[2]
    assert "''s'" not in row and "\"'s\"" in row
