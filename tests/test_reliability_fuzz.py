"""Fuzzing: Hypothesis properties over the tokenizer, the mask, softmax, sampling parameters, the
trace manifest reader and the file loaders, and schema-driven fuzzing of the inspector's API.

Every property compares with an independent reference where one exists
(Hugging Face ``tokenizers`` for the ids, ``torch.triu`` for the mask,
``torch.softmax`` in float64, a sort-based top-k / top-p written here) and
otherwise checks an invariant that holds for *every* input: a bad value gives
one ``ValueError``/``TypeError`` line, never another exception and never a NaN.

``GLASSLLM_FUZZ_EXAMPLES`` sets the number of examples per property (default:
the small numbers below, which keep this file to seconds);
``tools/reliability_report.py`` runs thousands and counts them in ``RUN``.
"""

from __future__ import annotations

import atexit
import json
import math
import os
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("hypothesis")

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from glassllm.hf import tokenizer_to_hf  # noqa: E402
from tests.test_reliability_inventory import get_env, has_nan  # noqa: E402

RUN: Counter = Counter()                 # property -> examples run (read by tools/reliability_report.py)
SCALE = int(os.environ.get("GLASSLLM_FUZZ_EXAMPLES", "0"))
if os.environ.get("GLASSLLM_FUZZ_COUNTS"):   # the report's pytest subprocess: leave the counts in this file
    atexit.register(lambda: Path(os.environ["GLASSLLM_FUZZ_COUNTS"]).write_text(json.dumps(dict(RUN), indent=1)))


def fuzz(n: int):
    """Hypothesis settings: ``n`` examples (or GLASSLLM_FUZZ_EXAMPLES), no deadline, no example database."""
    return settings(max_examples=SCALE or n, deadline=None, database=None, derandomize=not SCALE,
                    suppress_health_check=[HealthCheck.too_slow, HealthCheck.function_scoped_fixture,
                                           HealthCheck.data_too_large, HealthCheck.filter_too_much])


def one_line_error(e: BaseException) -> None:
    assert isinstance(e, (ValueError, TypeError)), f"{type(e).__name__}: {e}"
    assert str(e).strip() and "\n" not in str(e).strip(), repr(str(e))


@pytest.fixture(scope="module")
def env():
    return get_env()


# ----------------------------------------------------------------------------
# The tokenizer
# ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def hf_tok(env):
    tokenizers = pytest.importorskip("tokenizers")
    return tokenizers.Tokenizer.from_str(json.dumps(tokenizer_to_hf(env.tok)))


TEXT = st.text(st.characters(codec="utf-8"), max_size=80) | st.sampled_from(
    ["", " ", "  \n\t", "<|endoftext|>", "a<|endoftext|>b", "é", "e\u0301", "日本語", "🙂🙂", "\r\n", "\x00"])


@fuzz(200)
@given(text=TEXT)
def test_tokenizer_matches_hugging_face_and_round_trips(env, hf_tok, text):
    RUN["tokenizer: ids = Hugging Face tokenizers', decode(encode(text)) = text"] += 1
    tok = env.tok
    ids = tok.encode(text, allowed_special="all")
    assert ids == hf_tok.encode(text).ids
    assert all(0 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == text
    plain = tok.encode(text)                                  # specials are text here
    assert tok.eot_id not in plain and tok.decode(plain) == text
    assert len(tok.pieces(ids)) == len(ids)


@fuzz(200)
@given(data=st.binary(max_size=80))
def test_tokenizer_bytes_api_takes_any_bytes(env, data):
    RUN["tokenizer: encode_bytes/decode_bytes on any bytes"] += 1
    tok = env.tok
    ids = tok.encode_bytes(data)
    assert tok.decode_bytes(ids) == data
    assert tok.decode(ids) == data.decode("utf-8", errors="replace")
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError:
        # The text API refuses the same bytes when they arrive as surrogate escapes (argv, file names).
        with pytest.raises(ValueError) as e:
            tok.encode(data.decode("utf-8", "surrogateescape"))
        one_line_error(e.value)
    else:
        assert tok.encode(text) == ids


@fuzz(200)
@given(ids=st.lists(st.one_of(st.integers(-10**6, 10**6), st.floats(), st.booleans(), st.text(max_size=2)),
                    max_size=8))
def test_tokenizer_decode_takes_ids_or_refuses(env, ids):
    RUN["tokenizer: decode of arbitrary values"] += 1
    ok = all(isinstance(i, int) and not isinstance(i, bool) and 0 <= i < env.tok.vocab_size for i in ids)
    try:
        text = env.tok.decode(ids)
    except Exception as e:  # noqa: BLE001
        assert not ok
        one_line_error(e)
    else:
        assert ok and isinstance(text, str)


# ----------------------------------------------------------------------------
# causal_mask and softmax
# ----------------------------------------------------------------------------

@fuzz(150)
@given(n=st.integers(0, 40), start=st.integers(0, 40), extra=st.integers(-5, 5))
def test_causal_mask_equals_torch_triu(n, start, extra):
    torch = pytest.importorskip("torch")
    from glassllm.nn import causal_mask

    RUN["causal_mask vs torch.triu"] += 1
    m = max(start + n + extra, 0)
    mask = causal_mask(n, m, start)
    assert mask.shape == (n, m) and mask.dtype == np.bool_
    ref = torch.ones(n, m, dtype=torch.bool).triu(diagonal=start + 1).numpy() if n and m else np.zeros((n, m), bool)
    assert np.array_equal(mask, ref)
    if m == start + n and n:
        assert (~mask).sum(axis=1).min() >= 1                  # every query may read at least itself
        assert not mask[:, : start + 1].any()                  # the cache and the first new key are open to all


@fuzz(200)
@given(args=st.tuples(*[st.one_of(st.integers(-3, 5), st.floats(allow_nan=True), st.booleans(), st.none(),
                                  st.text(max_size=2))] * 3))
def test_causal_mask_refuses_what_is_not_a_count(args):
    from glassllm.nn import causal_mask

    RUN["causal_mask: arbitrary arguments"] += 1
    good = all(isinstance(a, int) and not isinstance(a, bool) and a >= 0 for a in args)
    try:
        causal_mask(*args)
    except Exception as e:  # noqa: BLE001
        assert not good
        one_line_error(e)
    else:
        assert good


FINITE = st.floats(-1e6, 1e6, allow_nan=False, allow_infinity=False)
ROWS = st.integers(1, 4).flatmap(lambda r: st.integers(1, 12).flatmap(
    lambda c: st.lists(st.lists(st.one_of(FINITE, st.just(-math.inf), st.floats(-1e308, 1e308)),
                                min_size=c, max_size=c), min_size=r, max_size=r)))


@fuzz(150)
@given(rows=ROWS, shift=FINITE)
def test_softmax_rows_are_distributions_equal_to_torch(rows, shift):
    torch = pytest.importorskip("torch")
    from glassllm.autograd import Tensor, softmax, softmax_np

    RUN["softmax_np and autograd softmax vs torch.softmax (float64)"] += 1
    x = np.array(rows, dtype=np.float64)
    p = softmax_np(x)
    assert not np.isnan(p).any()
    dead = np.isneginf(x).all(axis=1)                          # every key forbidden: zeros, not NaN
    assert np.array_equal(p[dead], np.zeros_like(p[dead]))
    live = ~dead
    np.testing.assert_allclose(p[live].sum(axis=1), 1.0, rtol=1e-12)
    assert (p >= 0).all() and (p[np.isneginf(x)] == 0).all()
    if live.any():
        np.testing.assert_allclose(p[live], torch.softmax(torch.tensor(x[live]), dim=-1).numpy(), rtol=1e-12,
                                   atol=1e-300)
        shifted = softmax_np(np.where(np.isneginf(x), x, x + shift)[live])   # a shift changes nothing
        np.testing.assert_allclose(shifted, p[live], rtol=1e-6, atol=1e-12)
    np.testing.assert_allclose(softmax(Tensor(x)).data, p, rtol=1e-12, atol=1e-300)


# ----------------------------------------------------------------------------
# Sampling parameters
# ----------------------------------------------------------------------------

ANY = st.one_of(st.none(), st.booleans(), st.integers(-5, 400), st.integers(), st.floats(),
                st.text(max_size=3), st.lists(st.integers(0, 3), max_size=2))
LOGITS = st.lists(st.floats(-30, 30), min_size=1, max_size=12).map(np.array)


def reference_distribution(z, t, k, p) -> np.ndarray:
    """softmax(z / t) restricted to the top-k (ties kept), then to the smallest prefix of mass >= p."""
    z = np.asarray(z, dtype=np.float64)
    if t == 0:
        out = np.zeros_like(z)
        out[int(np.argmax(z))] = 1.0
        return out
    probs = np.exp((z - z.max()) / t)
    probs /= probs.sum()
    keep = probs > 0
    if k is not None:
        keep &= z >= np.sort(z)[::-1][k - 1]
    if p is not None:
        ids = [i for i in sorted(np.flatnonzero(keep), key=lambda i: (-probs[i], i))]
        mass = probs[ids] / probs[ids].sum()
        survivors, above = [], 0.0
        for i, q in zip(ids, mass):
            if above < p:
                survivors.append(i)
            above += q
        keep = np.isin(np.arange(len(z)), survivors)
    out = np.where(keep, probs, 0.0)
    return out / out.sum()


def _valid(t, k, p, V) -> bool:
    num = lambda x: isinstance(x, (int, float)) and not isinstance(x, bool)  # noqa: E731
    return (num(t) and math.isfinite(t) and t >= 0
            and (k is None or (isinstance(k, int) and not isinstance(k, bool) and 1 <= k <= V))
            and (p is None or (num(p) and 0 < p <= 1)))


@fuzz(300)
@given(z=LOGITS, t=st.one_of(ANY, st.floats(0.05, 5)), k=st.one_of(ANY, st.integers(1, 12)),
       p=st.one_of(ANY, st.floats(0.01, 1.0)))
def test_sampling_parameters_give_a_distribution_or_one_line(z, t, k, p):
    from glassllm.sampling import sampling_distribution

    RUN["sampling_distribution: arbitrary temperature, top_k, top_p"] += 1
    valid = _valid(t, k, p, len(z))
    try:
        d = sampling_distribution(z, t, k, p)
    except Exception as e:  # noqa: BLE001
        assert not valid, f"valid parameters refused: {e}"
        one_line_error(e)
        return
    assert valid
    assert not np.isnan(d).any() and (d >= 0).all() and abs(d.sum() - 1) < 1e-12
    # The most likely id always survives (most likely after the temperature: a huge T rounds
    # every probability to the same number, and then the lowest id is the most likely).
    top = int(np.argmax(z)) if float(t) == 0 else int(np.argmax(np.exp((z - z.max()) / float(t))))
    assert d[top] > 0
    np.testing.assert_allclose(d, reference_distribution(z, float(t), k, None if p is None else float(p)),
                               rtol=1e-9, atol=1e-15)


@fuzz(150)
@given(t=ANY, k=ANY, p=ANY, n=ANY, seed=ANY)
def test_generate_takes_any_parameters_without_a_traceback(env, t, k, p, n, seed):
    from glassllm.generate import generate

    RUN["generate: arbitrary temperature, top_k, top_p, max_new_tokens, seed"] += 1
    try:
        records = list(generate(env.model, env.tok, "once upon", max_new_tokens=n, temperature=t, top_k=k,
                                top_p=p, seed=seed))
    except Exception as e:  # noqa: BLE001
        one_line_error(e)
        return
    assert records and all(math.isfinite(r.prob) and 0 < r.p_sampled <= 1 for r in records)


# ----------------------------------------------------------------------------
# The trace manifest reader, and files mutated byte by byte
# ----------------------------------------------------------------------------

JSON = st.recursive(st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=6),
                    lambda c: st.lists(c, max_size=4) | st.dictionaries(st.text(max_size=6), c, max_size=4),
                    max_leaves=12)


@pytest.fixture(scope="module")
def manifest(env):
    from glassllm.trace import trace

    t = trace(env.model, [5, 6, 7], names=["embed", "attn.softmax", "logits"], targets=[6, 7, 8])
    return t.manifest()


def _mutate(doc, path: list, value):
    """``doc`` with the item at ``path`` replaced by ``value`` (or deleted, for value ``...``)."""
    doc = json.loads(json.dumps(doc))
    node = doc
    for key in path[:-1]:
        node = node[key]
    if value is ...:
        del node[path[-1]]
    else:
        node[path[-1]] = value
    return doc


def _paths(doc, prefix=()):
    yield list(prefix)
    if isinstance(doc, dict):
        for k, v in doc.items():
            yield from _paths(v, (*prefix, k))
    elif isinstance(doc, list):
        for i, v in enumerate(doc):
            yield from _paths(v, (*prefix, i))


@fuzz(250)
@given(data=st.data())
def test_manifest_reader_refuses_any_bad_field_in_one_line(manifest, data):
    from glassllm.trace import validate_manifest

    RUN["trace manifest: a field replaced or deleted"] += 1
    paths = [p for p in _paths(manifest) if p]
    path = data.draw(st.sampled_from(paths))
    value = data.draw(JSON | st.just(...) | st.integers(-2, 2**70))
    doc = _mutate(manifest, path, value)
    try:
        validate_manifest(doc)
    except Exception as e:  # noqa: BLE001
        one_line_error(e)


@fuzz(200)
@given(doc=JSON)
def test_manifest_reader_refuses_any_json(doc):
    from glassllm.trace import validate_manifest

    RUN["trace manifest: arbitrary JSON"] += 1
    with pytest.raises((ValueError, TypeError)) as e:
        validate_manifest(doc)
    one_line_error(e.value)


def _mutations(blob: bytes):
    """Strategy: ``blob`` with a few bytes changed, a cut, or a slice repeated."""
    n = len(blob)
    flip = st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, 255)), min_size=1, max_size=6).map(
        lambda edits: _apply(blob, edits))
    cut = st.integers(0, n - 1).map(lambda i: blob[:i])
    head = st.lists(st.tuples(st.integers(0, min(n, 600) - 1), st.integers(0, 255)), min_size=1, max_size=4).map(
        lambda edits: _apply(blob, edits))                    # the header, where the structure is
    return st.one_of(flip, cut, head)


def _apply(blob: bytes, edits) -> bytes:
    b = bytearray(blob)
    for i, v in edits:
        b[i] = v
    return bytes(b)


def _loads_or_refuses(load, path, check) -> None:
    try:
        result = load(path)
    except Exception as e:  # noqa: BLE001
        one_line_error(e)
    else:
        check(result)


@fuzz(150)
@given(data=st.data())
def test_mutated_model_files_load_or_are_refused(env, tmp_path_factory, data):
    from glassllm.checkpoint import load_model

    RUN["model file: bytes changed or cut"] += 1
    blob = data.draw(_mutations((env.root / "tiny.safetensors").read_bytes()))
    path = tmp_path_factory.mktemp("m") / "m.safetensors"
    path.write_bytes(blob)

    def check(result):
        model, tok, _ = result
        assert not any(has_nan(p.data) or not np.isfinite(p.data).all() for p in model.parameters())
        assert tok.vocab_size == model.config.vocab_size
    _loads_or_refuses(load_model, path, check)


@fuzz(150)
@given(data=st.data())
def test_mutated_tokenizer_files_load_or_are_refused(env, data):
    from glassllm.tokenizer import Tokenizer

    RUN["tokenizer file: bytes changed or cut"] += 1
    blob = data.draw(_mutations((env.root / "tok.json").read_bytes()))

    def check(tok):
        text = "Once upon a time, Tom's 3 cats ran -- fast!\n\t\u00e9\u65e5\U0001f642 <|endoftext|>"
        try:
            ids = tok.encode(text, allowed_special="all")
        except ValueError as e:                      # a damaged pattern that drops characters: refused
            one_line_error(e)
            return
        assert tok.decode(ids) == text and all(0 <= i < tok.vocab_size for i in ids)
    _loads_or_refuses(Tokenizer.from_json, blob, check)


@fuzz(100)
@given(data=st.data())
def test_mutated_trace_files_load_or_are_refused(env, tmp_path_factory, data):
    from glassllm.trace import load_trace, trace

    RUN["trace file: bytes changed or cut"] += 1
    folder = tmp_path_factory.mktemp("t")
    if "trace_blob" not in env.extra:
        trace(env.model, [5, 6, 7], names=["embed", "attn.softmax"], targets=[6, 7, 8]).save(folder / "good.npz")
        env.extra["trace_blob"] = (folder / "good.npz").read_bytes()
    path = folder / "t.npz"
    path.write_bytes(data.draw(_mutations(env.extra["trace_blob"])))
    _loads_or_refuses(load_trace, path, lambda t: [np.asarray(s.values[k]) for s in t.steps for k in s.values])


# ----------------------------------------------------------------------------
# The inspector's API, fuzzed from its OpenAPI description (schemathesis)
# ----------------------------------------------------------------------------

def api_schemas(env, tight: bool):
    """The app's OpenAPI description (as FastAPI makes it; the app does not serve it), wired to the app.

    ``tight``: a copy narrowed to what this model accepts (snapshot names from
    the registry, layers and heads in range, short prompts) so that generated
    requests also reach the model, not only the validators.
    """
    schemathesis = pytest.importorskip("schemathesis")
    pytest.importorskip("fastapi")
    app = env.client().app
    raw = json.loads(json.dumps(app.openapi()))
    if tight:
        info = env.client().get("/api/info").json()
        props = raw["components"]["schemas"]
        names = [n["name"] for n in info["names"]]
        props["SnapshotRequest"]["properties"]["name"] = {"type": "string", "enum": names}
        for model in ("SnapshotRequest", "NextRequest", "PromptRequest"):
            props[model]["properties"]["prompt"] = {"type": "string", "minLength": 1, "maxLength": 40}
        for field, high in (("layer", 1), ("head", 3), ("step", 5), ("target", 299)):
            if field in props["SnapshotRequest"]["properties"]:
                props["SnapshotRequest"]["properties"][field] = {"anyOf": [
                    {"type": "integer", "minimum": 0, "maximum": high}, {"type": "null"}]}
    schema = schemathesis.openapi.from_dict(raw)
    schema.app = app                                                 # requests go to the app (ASGI)
    return [r.ok() for r in schema.get_all_operations()]


def check_response(response) -> None:
    status = response.status_code
    assert status < 500, f"HTTP {status}: {response.text[:300]}"
    body = response.json()
    if status >= 400:
        assert set(body) == {"error"} and "\n" not in body["error"].strip() and body["error"].strip()
    else:
        assert not has_nan(body)


@pytest.mark.parametrize("mode, tight", [("positive", False), ("negative", False), ("positive", True)])
def test_inspector_api_has_no_5xx_under_schema_fuzzing(env, mode, tight):
    from schemathesis import GenerationMode

    for op in api_schemas(env, tight):
        if mode == "negative" and op.method.upper() == "GET":
            continue                                                 # no parameters: nothing to get wrong
        strategy = op.as_strategy(generation_mode=GenerationMode(mode))
        label = f"inspector API ({'narrowed schema' if tight else 'its OpenAPI'}, {mode}): {op.method.upper()} {op.path}"

        @fuzz(20 if op.path != "/api/info" else 5)
        @given(case=strategy)
        def run(case):
            RUN[label] += 1
            check_response(case.call(headers={"host": "127.0.0.1"}))

        run()
