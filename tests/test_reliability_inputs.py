"""Bad input at the Python API and the command line: one clear line each, never a traceback or a NaN.

The cases are data (:class:`~test_reliability_inventory.Case`); this file
lists them and runs each one. ``test_reliability_inventory`` explains how a
case is judged and keeps the table in docs/reliability.md equal to this list.
Paths are relative to the environment's folder (a tiny model ``tiny.safetensors``
of 300 ids and 64 positions, its tokenizer ``tok.json``, one of 280 ids
``tok280.json``, text ``train.txt``, broken files, and ``ro``, a folder the
OS refuses to write into).
"""

from __future__ import annotations

import numpy as np
import pytest

from tests.test_reliability_inventory import Case, get_env, run_case, shell

LONG = "once upon a time " * 40          # 160 tokens or so: longer than the 64-position context


# ----------------------------------------------------------------------------
# Helpers that make the calls
# ----------------------------------------------------------------------------

def gen(prompt, tokenizer=True, **kw):
    def run(env):
        from glassllm.generate import generate

        kw.setdefault("max_new_tokens", 4)
        return list(generate(env.model, env.tok if tokenizer else None, prompt, **kw))
    return run


def call_model(tokens, cache_first=None):
    def run(env):
        if cache_first is None:
            return env.model(tokens).data
        cache = env.model.new_cache(1)
        env.model(np.zeros(cache_first, dtype=np.int64), cache)
        return env.model(tokens, cache).data
    return run


def traced(tokens=(5, 6, 7), names=None, get=None, **kw):
    def run(env):
        from glassllm.trace import trace

        t = trace(env.model, list(tokens), names=names, **kw)
        return t if get is None else t.get(*get[0], **get[1])
    return run


def inspector(env):
    from glassllm.inspector import Inspector, Limits

    if "inspector" not in env.extra:
        env.extra["inspector"] = Inspector(env.model, env.tok, Limits(max_prompt_tokens=32, max_new_tokens=4,
                                                                      max_cells=1024))
    return env.extra["inspector"]


def snap(**body):
    def run(env):
        from glassllm.inspector.schema import SnapshotRequest

        return inspector(env).snapshot(SnapshotRequest(**{"prompt": "once upon a time", **body}))
    return run


def load(path):
    def run(env):
        from glassllm.checkpoint import load_model

        return load_model(path)
    return run


def quiet(fn):
    """``fn`` with NumPy's overflow warnings off (the error it raises is what the case judges)."""
    def run(env):
        with np.errstate(all="ignore"):
            return fn(env)
    return run


def tok_call(method, *args, **kw):
    def run(env):
        return getattr(env.tok, method)(*args, **kw)
    return run


def write_then(write, path):
    """Write ``path`` once normally, then again with the disk full (that one must fail, the first stay)."""
    def run(env):
        import os

        if os.path.exists(path):
            os.remove(path)
        return write(env, path)
    return run


def kept(path, check):
    def after(env):
        check(env, path)
    return after


def _save_model(env, path):
    from glassllm.checkpoint import save_model

    save_model(path, env.model, env.tok)


def _trainer(env, out, **kw):
    from glassllm.config import ModelConfig
    from glassllm.train import TrainConfig, Trainer

    tokenizer = kw.pop("tokenizer", env.tok)
    config = TrainConfig(steps=3, batch_size=2, seq_len=16, warmup_steps=1, checkpoint_every=1, eval_every=0)
    return Trainer(config, ModelConfig(**{**env.model.config.to_dict(), **kw}), ["train.txt"], out,
                   tokenizer=tokenizer, progress=False)


def _full_disk_training(env):
    """Two saved steps, then the disk fills during the third step's save."""
    import shutil

    with _disk_ok():
        shutil.rmtree("full-run", ignore_errors=True)
        trainer = _trainer(env, "full-run")
        trainer.run(until=2)
    trainer.run(until=3)                                        # the case runs with the disk full


class _disk_ok:
    """Lift the simulated full disk for a moment (inside a disk_full case)."""

    def __enter__(self):
        import resource

        self.soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (hard, hard))

    def __exit__(self, *exc):
        import resource

        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (self.soft, hard))


def _state_at_step_2(env):
    from glassllm.checkpoint import load_model
    from glassllm.train import Trainer

    assert Trainer.resume("full-run", progress=False).step == 2
    assert load_model("full-run/model.safetensors")[2]["step"] == "2"
    assert not list(__import__("pathlib").Path("full-run").glob(".*.tmp")), "a temporary file was left"


def _old_file_intact(env, path):
    from glassllm.checkpoint import load_model

    model, _, _ = load_model(path)
    assert all(np.array_equal(v, env.model.state_dict()[k]) for k, v in model.state_dict().items())


def _prepare_old(path):
    """Before a disk-full case: a good copy of the file exists, which the failed write must keep."""
    def run(env):
        from glassllm.checkpoint import save_model

        with _disk_ok():
            save_model(path, env.model, env.tok)
        save_model(path, env.model, env.tok)
    return run


# ----------------------------------------------------------------------------
# The Python API
# ----------------------------------------------------------------------------

A = "api"

API_CASES = [
    # -- empty prompts -------------------------------------------------------------
    Case(A, "empty prompt", "generate(model, tok, '')", gen(""), ("prompt", "empty")),
    Case(A, "empty prompt", "generate(model, None, [])", gen([], tokenizer=False), ("prompt", "empty")),
    Case(A, "empty prompt", "generate_batch(model, tok, ['hi', ''])",
         lambda env: list(__import__("glassllm.generate", fromlist=["x"]).generate_batch(
             env.model, env.tok, ["hi", ""], max_new_tokens=2)), ("prompt 1", "empty")),
    Case(A, "empty prompt", "generate_batch(model, tok, [])",
         lambda env: list(__import__("glassllm.generate", fromlist=["x"]).generate_batch(env.model, env.tok, [])),
         ("prompts", "non-empty")),
    Case(A, "empty prompt", "model([])", call_model([]), ("empty",)),
    Case(A, "empty prompt", "trace(model, [])", traced(()), ("empty",)),
    Case(A, "empty prompt", "Inspector.encode('')", lambda env: inspector(env).encode(""), ("prompt", "empty")),
    Case(A, "empty prompt", "tok.encode('')", tok_call("encode", ""), ok=True, note="no text, no ids: []"),
    # -- whitespace-only prompts: valid text ------------------------------------------
    Case(A, "whitespace-only prompt", "generate(model, tok, '   ')", gen("   "), ok=True,
         note="valid text; generates as usual, probabilities finite"),
    Case(A, "whitespace-only prompt", "generate(model, tok, '\\n\\t ')", gen("\n\t "), ok=True,
         note="valid text; generates as usual"),
    Case(A, "whitespace-only prompt", "trace(model, tok.encode(' '))",
         lambda env: __import__("glassllm.trace", fromlist=["x"]).trace(env.model, env.tok.encode(" ")), ok=True,
         note="every snapshot finite"),
    Case(A, "whitespace-only prompt", "Inspector.next_token(prompt='  ')",
         lambda env: inspector(env).next_token(__import__("glassllm.inspector.schema", fromlist=["x"]).NextRequest(
             prompt="  ")), ok=True, note="logits and survivors, finite"),
    # -- longer than the context ------------------------------------------------------
    Case(A, "prompt longer than the context", "generate(model, tok, 'once upon a time ' * 40)", gen(LONG),
         ("prompt", "tokens", "context of 64")),
    Case(A, "prompt longer than the context", "generate(model, tok, 'hi', max_new_tokens=63)",
         gen("hi", max_new_tokens=63), ("max_new_tokens=63", "context of 64")),
    Case(A, "prompt longer than the context", "generate(model, None, list(range(65)))",
         gen(list(range(65)), tokenizer=False), ("65 tokens", "context of 64")),
    Case(A, "prompt longer than the context", "model(np.zeros(65, int))", call_model(np.zeros(65, dtype=np.int64)),
         ("65 positions", "context length 64")),
    Case(A, "prompt longer than the context", "model(ids of 10, cache holding 60)",
         call_model(np.ones(10, dtype=np.int64), cache_first=60), ("70 positions", "capacity 64")),
    Case(A, "prompt longer than the context", "trace(model, range(65))", traced(range(65)),
         ("65 positions", "64")),
    Case(A, "prompt longer than the context", "Inspector.encode('once upon a time ' * 40)",
         lambda env: inspector(env).encode(LONG), ("tokens", "at most 32")),
    # -- invalid UTF-8 ---------------------------------------------------------------
    Case(A, "invalid UTF-8", "tok.encode_bytes(b'\\xff\\xfe\\x80abc')",
         lambda env: env.tok.encode_bytes(b"\xff\xfe\x80abc"), ok=True,
         note="the bytes API takes any bytes: ids that decode_bytes turns back into them"),
    Case(A, "invalid UTF-8", "tok.decode(ids of a cut multi-byte character)",
         lambda env: env.tok.decode(env.tok.encode_bytes("é".encode()[:1])), ok=True,
         note="U+FFFD for the broken character"),
    Case(A, "invalid UTF-8", "tok.encode(b'\\xff')", tok_call("encode", b"\xff"), ("str", "bytes", "encode_bytes")),
    Case(A, "invalid UTF-8", "tok.encode('\\udcff')  # what Python makes of byte 0xff in argv",
         tok_call("encode", "\udcff"), ("not valid UTF-8", "byte 0xff", "encode_bytes")),
    Case(A, "invalid UTF-8", "tok.encode_corpus('abc\\udcff')", tok_call("encode_corpus", "abc\udcff"),
         ("not valid UTF-8", "character 3")),
    Case(A, "invalid UTF-8", "tok.encode('a\\ud800')  # a lone surrogate that no byte makes",
         tok_call("encode", "a\ud800"), ("surrogate", "'\\ud800'", "index 1", "not valid Unicode")),
    Case(A, "invalid UTF-8", "generate(model, tok, b'\\xff')", gen(b"\xff"), ("prompt", "str", "bytes")),
    Case(A, "invalid UTF-8", "Tokenizer.from_json(b'\\xff\\xfe')",
         lambda env: type(env.tok).from_json(b"\xff\xfe"), ("not UTF-8",)),
    Case(A, "invalid UTF-8", "Tokenizer.train(['not-utf8.txt'], vocab_size=260)",
         lambda env: type(env.tok).train([__import__("pathlib").Path("not-utf8.txt")], vocab_size=260), ok=True,
         note="undecodable bytes in a file are kept as bytes and trained on"),
]

# -- sampling parameters: negative, NaN, infinite ------------------------------------
for name, value, words in [
    ("temperature", -1.0, ("temperature", "-1", ">= 0")),
    ("temperature", float("nan"), ("temperature", "nan", "finite")),
    ("temperature", float("inf"), ("temperature", "inf", "finite")),
    ("temperature", float("-inf"), ("temperature", "-inf", ">= 0")),
    ("top_k", -1, ("top_k", "-1", "[1, 300]")),
    ("top_k", 0, ("top_k", "0", "[1, 300]")),
    ("top_k", 301, ("top_k", "301", "[1, 300]")),
    ("top_p", -0.5, ("top_p", "-0.5", "(0, 1]")),
    ("top_p", 0.0, ("top_p", "0.0", "(0, 1]")),
    ("top_p", 1.5, ("top_p", "1.5", "(0, 1]")),
    ("top_p", float("nan"), ("top_p", "nan", "(0, 1]")),
    ("top_p", float("inf"), ("top_p", "inf", "(0, 1]")),
    ("max_new_tokens", 0, ("max_new_tokens", "0", ">= 1")),
    ("max_new_tokens", -1, ("max_new_tokens", "-1", ">= 1")),
    ("seed", -1, ("seed", "-1", ">= 0")),
    ("alternatives", -1, ("alternatives", "-1", "[0, 300]")),
]:
    API_CASES.append(Case(A, "sampling parameter out of range", f"generate(..., {name}={value!r})",
                          gen("hi", **{name: value}), words))
API_CASES += [
    Case(A, "sampling parameter out of range", "sampling_distribution(logits, temperature=nan)",
         lambda env: __import__("glassllm.sampling", fromlist=["x"]).sampling_distribution(
             np.zeros(5), temperature=float("nan")), ("temperature", "nan")),
    Case(A, "sampling parameter out of range", "sampling_distribution(logits with a NaN)",
         lambda env: __import__("glassllm.sampling", fromlist=["x"]).sampling_distribution(
             np.array([1.0, float("nan")])), ("logits", "NaN")),
    Case(A, "sampling parameter out of range", "sample([0.5, nan], rng)",
         lambda env: __import__("glassllm.sampling", fromlist=["x"]).sample(
             np.array([0.5, float("nan")]), np.random.default_rng(0)), ("probs", "nan")),
    Case(A, "sampling parameter out of range", "sample([-1, 2], rng)",
         lambda env: __import__("glassllm.sampling", fromlist=["x"]).sample(
             np.array([-1.0, 2.0]), np.random.default_rng(0)), ("probs", ">= 0", "-1.0")),
    Case(A, "sampling parameter out of range", "sample([0, 0], rng)",
         lambda env: __import__("glassllm.sampling", fromlist=["x"]).sample(
             np.zeros(2), np.random.default_rng(0)), ("probs", "positive sum", "0.0")),
    Case(A, "sampling parameter out of range", "SamplingConfig(top_p=0)",
         lambda env: __import__("glassllm.sampling", fromlist=["x"]).SamplingConfig(top_p=0), ("top_p", "0")),
    Case(A, "sampling parameter out of range", "TrainConfig(lr=nan)",
         lambda env: __import__("glassllm.train", fromlist=["x"]).TrainConfig(lr=float("nan")), ("lr", "nan")),
    Case(A, "sampling parameter out of range", "ModelConfig(norm_eps=10**400)",
         lambda env: __import__("glassllm.config", fromlist=["x"]).ModelConfig(norm_eps=10**400),
         ("norm_eps", "finite")),
]

# -- the wrong type -----------------------------------------------------------------
for name, value, words in [
    ("temperature", "0.7", ("temperature", "'0.7'", "number")),
    ("temperature", None, ("temperature", "None", "number")),
    ("temperature", True, ("temperature", "True", "number")),
    ("temperature", [1.0], ("temperature", "[1.0]", "number")),
    ("top_k", 2.5, ("top_k", "2.5", "int")),
    ("top_k", "5", ("top_k", "'5'", "int")),
    ("top_k", True, ("top_k", "True", "int")),
    ("top_p", "0.9", ("top_p", "'0.9'", "number")),
    ("top_p", True, ("top_p", "True", "number")),
    ("max_new_tokens", 3.0, ("max_new_tokens", "3.0", "int")),
    ("max_new_tokens", "3", ("max_new_tokens", "'3'", "int")),
    ("max_new_tokens", None, ("max_new_tokens", "None", "int")),
    ("seed", "0", ("seed", "'0'", "int")),
    ("seed", 1.5, ("seed", "1.5", "int")),
    ("stop", 5, ("stop", "str", "int")),
    ("fast", "yes", ("fast", "'yes'", "True, False or None")),
]:
    API_CASES.append(Case(A, "parameter of the wrong type", f"generate(..., {name}={value!r})",
                          gen("hi", **{name: value}), words))
API_CASES += [
    Case(A, "parameter of the wrong type", "generate(model, tok, 42)", gen(42), ("prompt", "str", "int")),
    Case(A, "parameter of the wrong type", "generate('model.safetensors', tok, 'hi')",
         lambda env: __import__("glassllm.generate", fromlist=["x"]).generate("tiny.safetensors", env.tok, "hi"),
         ("model", "Transformer", "str")),
    Case(A, "parameter of the wrong type", "ModelConfig(dim='128')",
         lambda env: __import__("glassllm.config", fromlist=["x"]).ModelConfig(dim="128"), ("dim", "'128'", "int")),
    Case(A, "parameter of the wrong type", "TrainConfig(batch_size=2.5)",
         lambda env: __import__("glassllm.train", fromlist=["x"]).TrainConfig(batch_size=2.5),
         ("batch_size", "2.5", "int")),
    Case(A, "parameter of the wrong type", "tok.encode('hi', allowed_special=True)",
         tok_call("encode", "hi", allowed_special=True), ("allowed_special", "bool")),
    Case(A, "parameter of the wrong type", "generate(model, 5, 'hi')",
         lambda env: list(__import__("glassllm.generate", fromlist=["x"]).generate(env.model, 5, "hi")),
         ("tokenizer", "Tokenizer", "int")),
    Case(A, "parameter of the wrong type", "save_model(path, model, None)",
         lambda env: __import__("glassllm.checkpoint", fromlist=["x"]).save_model(
             "never.safetensors", env.model, None), ("tokenizer", "Tokenizer", "NoneType")),
    Case(A, "parameter of the wrong type", "load_model(path, dtype='float16')",
         lambda env: __import__("glassllm.checkpoint", fromlist=["x"]).load_model("tiny.safetensors", dtype="float16"),
         ("dtype", "float32 or float64", "float16")),
    Case(A, "parameter of the wrong type", "tok.decode({72, 105})", tok_call("decode", {72, 105}),
         ("ids", "list of ints", "set")),
    Case(A, "parameter of the wrong type", "sample(probs, rng, size=2.0)",
         lambda env: __import__("glassllm.sampling", fromlist=["x"]).sample(
             [0.5, 0.5], np.random.default_rng(0), size=2.0), ("size", "2.0", "int")),
    Case(A, "parameter of the wrong type", "Temperature(2.0, layers=[0, 0])",
         traced(interventions=__import__("glassllm.trace", fromlist=["x"]).Temperature(2.0, layers=[0, 0])),
         ("layer 0", "twice")),
    Case(A, "parameter of the wrong type", "Edit('embed', to 1e39) in a float32 model",
         traced(interventions=__import__("glassllm.trace", fromlist=["x"]).Edit(
             "embed", lambda x: np.full(x.shape, 1e39))), ("embed", "infinite in float32")),
]

# -- token ids -------------------------------------------------------------------------
API_CASES += [
    Case(A, "token id out of range", "model([300])", call_model([300]), ("300", "[0, 300)")),
    Case(A, "token id out of range", "model([-1])", call_model([-1]), ("-1", "[0, 300)")),
    Case(A, "token id out of range", "model([[1, 2], [3, 999]])", call_model([[1, 2], [3, 999]]), ("999", "[0, 300)")),
    Case(A, "token id out of range", "model([1.5])", call_model(np.array([1.5])), ("integers", "float64")),
    Case(A, "token id out of range", "model(['a'])", call_model(np.array(["a"])), ("integers", "<U1")),
    Case(A, "token id out of range", "model.loss(x, targets with 300)",
         lambda env: env.model.loss(np.array([[1, 2, 3]]), np.array([[1, 2, 300]])), ("300", "[0, 300)")),
    Case(A, "token id out of range", "generate(model, None, [5, 300])", gen([5, 300], tokenizer=False),
         ("300", "[0, 300)")),
    Case(A, "token id out of range", "generate(model, None, [5, -2])", gen([5, -2], tokenizer=False),
         ("-2", "[0, 300)")),
    Case(A, "token id out of range", "trace(model, [5, 300])", traced((5, 300)), ("300", "[0, 300)")),
    Case(A, "token id out of range", "tok.decode([300])", tok_call("decode", [300]), ("300", "< 300")),
    Case(A, "token id out of range", "tok.decode([-5])", tok_call("decode", [-5]), ("-5", "0 <= id")),
    Case(A, "token id out of range", "tok.decode([1.0])", tok_call("decode", [1.0]), ("1.0", "int")),
    Case(A, "token id out of range", "tok.piece(1000)", tok_call("piece", 1000), ("1000", "< 300")),
    Case(A, "token id out of range", "Inspector.snapshot(grad=True, target=300)",
         snap(name="logits", grad=True, target=300), ("target 300", "[0, 300)")),
]

# -- model and tokenizer files ------------------------------------------------------------
_FILES = [
    ("missing.safetensors", ("missing.safetensors", "does not exist")),
    ("folder.safetensors", ("folder.safetensors", "not a regular file")),
    ("empty.safetensors", ("empty.safetensors", "0 bytes")),
    ("short.safetensors", ("short.safetensors", "3 bytes")),
    ("truncated.safetensors", ("truncated.safetensors", "truncated")),
    ("header-only.safetensors", ("header-only.safetensors", "outside the file")),
    ("corrupt.safetensors", ("corrupt.safetensors", "not a glassllm model file")),
    ("deep.safetensors", ("deep.safetensors", "not JSON")),
    ("tok.json", ("tok.json", "JSON text")),
    ("pickle.pt", ("pickle.pt", "pickle", "never loads")),
    ("plain.safetensors", ("plain.safetensors", "format", "glassllm-model")),
    ("version2.safetensors", ("version2.safetensors", "'2'", "'1'")),
    ("nan.safetensors", ("nan.safetensors", "norm.weight", "NaN")),
    ("huge-tensor.safetensors", ("huge-tensor.safetensors", "tok_embeddings.weight", "outside the file")),
    ("huge-shape.safetensors", ("huge-shape.safetensors", "(1000000, 1000000)", "holds")),
    ("huge-config.safetensors", ("huge-config.safetensors", "dim=1048576", "over the limit")),
    ("huge-context.safetensors", ("huge-context.safetensors", "max_seq_len=1000000000", "positions")),
    ("int8.safetensors", ("int8.safetensors", "'I8'", "F32 or F64")),
    ("wrong-shape.safetensors", ("wrong-shape.safetensors", "output.weight", "(300, 32)")),
    ("missing-tensor.safetensors", ("missing-tensor.safetensors", "missing tensor", "output.weight")),
    ("extra-tensor.safetensors", ("extra-tensor.safetensors", "unexpected tensor", "lm_head.weight")),
    ("bad-config.safetensors", ("bad-config.safetensors", "norm_eps", "'tiny'")),
]
for path, words in _FILES:
    API_CASES.append(Case(A, "bad model or tokenizer file", f"load_model({path!r})", load(path), words))
API_CASES += [
    Case(A, "bad model or tokenizer file", "evaluate(model of 'overflow.safetensors', ids, tok, seq_len=16)",
         quiet(lambda env: __import__("glassllm.train", fromlist=["x"]).evaluate(
             load("overflow.safetensors")(env)[0], env.tok.encode("once upon a time there was a cat"), env.tok,
             seq_len=16)),
         ("loss", "not finite")),
    Case(A, "bad model or tokenizer file", "generate(model of 'overflow.safetensors', tok, 'hi', max_new_tokens=4)",
         quiet(lambda env: list(__import__("glassllm.generate", fromlist=["x"]).generate(
             load("overflow.safetensors")(env)[0], env.tok, "hi", max_new_tokens=4))), ("logits", "NaN")),
    Case(A, "bad model or tokenizer file", "Tokenizer.load('missing.json')",
         lambda env: type(env.tok).load("missing.json"), ("missing.json", "not found")),
    Case(A, "bad model or tokenizer file", "Tokenizer.load('bad-tokenizer.json')",
         lambda env: type(env.tok).load("bad-tokenizer.json"), ("bad-tokenizer.json", "not valid JSON")),
    Case(A, "bad model or tokenizer file", "Tokenizer.load('deep-tokenizer.json')",
         lambda env: type(env.tok).load("deep-tokenizer.json"), ("deep-tokenizer.json", "not valid JSON")),
    Case(A, "bad model or tokenizer file", "Tokenizer.load('tiny.safetensors')",
         lambda env: type(env.tok).load("tiny.safetensors"), ("tiny.safetensors",)),
    Case(A, "bad model or tokenizer file", "load_trace('tiny.safetensors')",
         lambda env: __import__("glassllm.trace", fromlist=["x"]).load_trace("tiny.safetensors"),
         ("tiny.safetensors", "not a trace file")),
    Case(A, "bad model or tokenizer file", "load_trace('missing.npz')",
         lambda env: __import__("glassllm.trace", fromlist=["x"]).load_trace("missing.npz"),
         ("missing.npz", "does not exist")),
    Case(A, "bad model or tokenizer file", "load_hf('hf-pickle')  # only pytorch_model.bin",
         lambda env: __import__("glassllm.hf", fromlist=["x"]).load_hf("hf-pickle"),
         ("hf-pickle", "pickled", "safetensors")),
    Case(A, "bad model or tokenizer file", "load_hf('hf-empty')",
         lambda env: __import__("glassllm.hf", fromlist=["x"]).load_hf("hf-empty"), ("hf-empty", "config.json")),
]

# -- files that disagree -------------------------------------------------------------------
API_CASES += [
    Case(A, "file and tokenizer disagree", "load_model('mismatch.safetensors')  # tokenizer of 280 ids",
         load("mismatch.safetensors"), ("280", "vocab_size=300")),
    Case(A, "file and tokenizer disagree", "load_model('three-layers.safetensors')  # config: 3 layers",
         load("three-layers.safetensors"), ("missing tensor", "layers.2")),
    Case(A, "file and tokenizer disagree", "generate(model, tok280, 'hi')",
         lambda env: list(__import__("glassllm.generate", fromlist=["x"]).generate(env.model, env.tok_other, "hi")),
         ("280", "300")),
    Case(A, "file and tokenizer disagree", "save_model('x.safetensors', model, tok280)",
         lambda env: __import__("glassllm.checkpoint", fromlist=["x"]).save_model("x.safetensors", env.model,
                                                                                  env.tok_other), ("280", "300")),
    Case(A, "file and tokenizer disagree", "Inspector(model, tok280)",
         lambda env: __import__("glassllm.inspector", fromlist=["x"]).Inspector(env.model, env.tok_other),
         ("280", "300")),
    Case(A, "file and tokenizer disagree", "Trainer(..., ModelConfig(vocab_size=300), tokenizer=tok280)",
         lambda env: _trainer(env, "mismatch-run", tokenizer=env.tok_other), ("280", "300")),
    Case(A, "file and tokenizer disagree", "load_trace(a trace whose manifest says dim=64, arrays of 32)",
         lambda env: _crafted_trace(env), ("'embed'", "[2, 32]", "expected [2, 64]")),
]


def _crafted_trace(env):
    """A real trace file whose manifest claims a model of width 64 (its arrays are 32 wide)."""
    import json
    import zipfile

    from glassllm.trace import load_trace, trace

    trace(env.model, [5, 6], names="embed").save("t.npz")
    with zipfile.ZipFile("t.npz") as z:
        members = {n: z.read(n) for n in z.namelist()}
    manifest = json.loads(members["manifest.json"])
    manifest["config"].update(dim=64, ffn_dim=128)
    members["manifest.json"] = json.dumps(manifest).encode()
    with zipfile.ZipFile("t3.npz", "w") as z:
        for name, data in members.items():
            z.writestr(name, data)
    return load_trace("t3.npz")


# -- snapshot names, layers, heads ----------------------------------------------------------
API_CASES += [
    Case(A, "unknown snapshot, layer or head", "trace(model, ids, names='attn.nope')", traced(names="attn.nope"),
         ("'attn.nope'", "names are")),
    Case(A, "unknown snapshot, layer or head", "trace(model, ids, names='layers.9.attn.q')",
         traced(names="layers.9.attn.q"), ("layer 9", "0..1")),
    Case(A, "unknown snapshot, layer or head", "trace(model, ids, names=5)", traced(names=5), ("str", "int")),
    Case(A, "unknown snapshot, layer or head", "trace(...).get('nope')", traced(get=(("nope",), {})),
         ("'nope'", "names are")),
    Case(A, "unknown snapshot, layer or head", "trace(...).get('attn.softmax', layer=2)",
         traced(get=(("attn.softmax",), {"layer": 2})), ("layer 2", "0..1")),
    Case(A, "unknown snapshot, layer or head", "trace(...).get('attn.softmax', layer=-3)",
         traced(get=(("attn.softmax",), {"layer": -3})), ("layer -3", "0..1")),
    Case(A, "unknown snapshot, layer or head", "trace(...).get('attn.softmax', layer=0, head=4)",
         traced(get=(("attn.softmax",), {"layer": 0, "head": 4})), ("head=4", "0..3")),
    Case(A, "unknown snapshot, layer or head", "trace(...).get('attn.k', layer=0, head=2)  # 2 K/V heads",
         traced(get=(("attn.k",), {"layer": 0, "head": 2})), ("head=2", "0..1")),
    Case(A, "unknown snapshot, layer or head", "trace(...).get('embed', head=0)",
         traced(get=(("embed",), {"head": 0})), ("'embed'", "no head axis")),
    Case(A, "unknown snapshot, layer or head", "trace(...).get('attn.q', layer=0, head='0')",
         traced(get=(("attn.q",), {"layer": 0, "head": "0"})), ("head", "'0'", "int")),
    Case(A, "unknown snapshot, layer or head", "trace(...).get('logits', step=3)",
         traced(get=(("logits",), {"step": 3})), ("step=3", "1 step")),
    Case(A, "unknown snapshot, layer or head", "trace(..., interventions=ZeroAblate(layer=0, head=9))",
         lambda env: traced(interventions=__import__("glassllm.trace", fromlist=["x"]).ZeroAblate(0, 9))(env),
         ("head=9", "0..3")),
    Case(A, "unknown snapshot, layer or head", "snapshot_shape('attn.nope')",
         lambda env: __import__("glassllm.trace", fromlist=["x"]).snapshot_shape("attn.nope"),
         ("'attn.nope'", "names are")),
    Case(A, "unknown snapshot, layer or head", "Inspector.snapshot(name='attn.nope')", snap(name="attn.nope"),
         ("'attn.nope'", "expected one of")),
    Case(A, "unknown snapshot, layer or head", "Inspector.snapshot(name='attn.softmax', layer=5, head=0)",
         snap(name="attn.softmax", layer=5, head=0), ("layer 5", "0..1")),
    Case(A, "unknown snapshot, layer or head", "Inspector.snapshot(name='attn.softmax', layer=0, head=7)",
         snap(name="attn.softmax", layer=0, head=7), ("head 7", "0..3")),
]

# -- output folders -------------------------------------------------------------------------
API_CASES += [
    Case(A, "output folder not writable", "save_model('ro/model.safetensors', model, tok)",
         lambda env: _save_model(env, "ro/model.safetensors"), ("'ro/model.safetensors'", "'ro' is not writable")),
    Case(A, "output folder not writable", "save_model('no-such-folder/model.safetensors', ...)",
         lambda env: _save_model(env, "no-such-folder/model.safetensors"), ("'no-such-folder'", "does not exist")),
    Case(A, "output folder not writable", "tok.save('ro/tok.json')", tok_call("save", "ro/tok.json"),
         ("'ro/tok.json'", "'ro' is not writable")),
    Case(A, "output folder not writable", "trace(...).save('ro/trace.npz')",
         lambda env: traced()(env).save("ro/trace.npz"), ("'ro/trace.npz'", "'ro' is not writable")),
    Case(A, "output folder not writable", "Trainer(..., out_dir='ro/run')", lambda env: _trainer(env, "ro/run"),
         ("'ro/run'", "'ro' is not writable")),
    Case(A, "output folder not writable", "Trainer(..., out_dir='tok.json')  # a file",
         lambda env: _trainer(env, "tok.json"), ("'tok.json'", "a file")),
    Case(A, "output folder not writable", "export_hf('tiny.safetensors', 'ro/hf')",
         lambda env: __import__("glassllm.hf", fromlist=["x"]).export_hf("tiny.safetensors", "ro/hf"),
         ("'ro/hf'", "'ro' is not writable")),
    Case(A, "output folder not writable", "export_html(inspector, 'hi', 'ro/page.html')",
         lambda env: __import__("glassllm.inspector", fromlist=["x"]).export_html(inspector(env), "hi",
                                                                                   "ro/page.html", steps=1),
         ("'ro/page.html'", "'ro' is not writable")),
]

# -- a full disk ---------------------------------------------------------------------------
API_CASES += [
    Case(A, "disk full (simulated)", "save_model('old.safetensors', ...) over a good old file",
         _prepare_old("old.safetensors"), ("'old.safetensors'", "disk is full"), disk_full=True,
         after=kept("old.safetensors", _old_file_intact)),
    Case(A, "disk full (simulated)", "tok.save('tok-full.json')", tok_call("save", "tok-full.json"),
         ("'tok-full.json'", "disk is full"), disk_full=True),
    Case(A, "disk full (simulated)", "trace(...).save('trace-full.npz')",
         lambda env: traced()(env).save("trace-full.npz"), ("'trace-full.npz'", "disk is full"), disk_full=True),
    Case(A, "disk full (simulated)", "Trainer.run(): the disk fills during step 3's save",
         _full_disk_training, ("train_state.safetensors", "disk is full"), disk_full=True,
         after=_state_at_step_2),
    Case(A, "disk full (simulated)", "export_hf('tiny.safetensors', 'hf-full')",
         lambda env: __import__("glassllm.hf", fromlist=["x"]).export_hf("tiny.safetensors", "hf-full"),
         ("hf-full", "disk is full"), disk_full=True),
    Case(A, "disk full (simulated)", "export_html(inspector, 'hi', 'page-full.html')",
         lambda env: __import__("glassllm.inspector", fromlist=["x"]).export_html(inspector(env), "hi",
                                                                                   "page-full.html", steps=1),
         ("'page-full.html'", "disk is full"), disk_full=True),
]


# ----------------------------------------------------------------------------
# The command line
# ----------------------------------------------------------------------------

M = ["--model", "tiny.safetensors"]
TRAIN = ["train", "--data", "train.txt", "--tokenizer", "tok.json", "--steps", "2", "--batch-size", "2",
         "--seq-len", "16", "--dim", "32", "--n-layers", "1", "--n-heads", "2", "--n-kv-heads", "1",
         "--no-progress"]


def C(kind, argv, mention=(), **kw) -> Case:
    text = shell(argv)
    if argv[:len(TRAIN) - 1] == TRAIN[:-1]:                                # the tiny run's options, abridged
        text = "glassllm train <tiny run on train.txt> " + shell(argv[len(TRAIN) - 1:])[len("glassllm "):]
    return Case("cli", kind, text, tuple(argv), mention, **kw)


CLI_CASES = [
    C("empty prompt", ["generate", "", *M], ("prompt", "empty")),
    C("empty prompt", ["inspect", "", *M, "--html", "page.html"], ("PROMPT", "empty")),
    C("empty prompt", ["tokenize", "", "--tokenizer", "tok.json"], ok=True, note="0 tokens for 0 bytes",
      numeric=True),
    C("whitespace-only prompt", ["generate", "   ", *M, "--max-new-tokens", "3"], ok=True,
      note="valid text; generates as usual"),
    C("whitespace-only prompt", ["generate", " \t", *M, "--max-new-tokens", "3", "--show-probs"], ok=True,
      note="probabilities printed, all finite", numeric=True),
    C("whitespace-only prompt", ["tokenize", "  ", "--tokenizer", "tok.json"], ok=True,
      note="one token per space run", numeric=True),
    C("prompt longer than the context", ["generate", LONG.strip(), *M], ("prompt", "tokens", "context of 64")),
    C("prompt longer than the context", ["generate", "hi", *M, "--max-new-tokens", "100"],
      ("max_new_tokens=100", "context of 64")),
    C("prompt longer than the context", ["inspect", LONG.strip(), *M, "--html", "page.html"],
      ("prompt", "tokens", "at most 63")),
    C("prompt longer than the context", ["eval", *M, "--data", "train.txt", "--seq-len", "65"],
      ("--seq-len", "65", "[1, 64]")),
    C("invalid UTF-8", ["generate", "\udcff\udcfe", *M], ("not valid UTF-8", "byte 0xff", "character 0")),
    C("invalid UTF-8", ["tokenize", "abc\udcff", "--tokenizer", "tok.json"], ("not valid UTF-8", "character 3")),
    C("invalid UTF-8", ["inspect", "\udcff", *M, "--html", "page.html"], ("not valid UTF-8", "byte 0xff")),
    C("invalid UTF-8", ["tokenize", "--train", "not-utf8.txt", "--vocab-size", "257", "--out", "t.json"], ok=True,
      note="undecodable bytes in a text file are kept as bytes"),
    C("invalid UTF-8", ["eval", *M, "--data", "not-utf8.txt", "--seq-len", "8", "--json"], ok=True,
      note="figures for the bytes as they are, finite", numeric=True),
]
for flag, value, words in [
    ("--temperature", "-1", ("--temperature", "-1", ">= 0")),
    ("--temperature", "nan", ("--temperature", "nan", "finite")),
    ("--temperature", "inf", ("--temperature", "inf", "finite")),
    ("--top-k", "0", ("--top-k", "0", "[1, 300]")),
    ("--top-k", "-3", ("--top-k", "-3", "[1, 300]")),
    ("--top-k", "301", ("--top-k", "301", "[1, 300]")),
    ("--top-p", "0", ("--top-p", "0", "(0, 1]")),
    ("--top-p", "1.5", ("--top-p", "1.5", "(0, 1]")),
    ("--top-p", "nan", ("--top-p", "nan", "(0, 1]")),
    ("--top-p=-inf", None, ("--top-p", "-inf", "(0, 1]")),
    ("--max-new-tokens", "0", ("--max-new-tokens", "0", ">= 1")),
    ("--max-new-tokens", "-1", ("--max-new-tokens", "-1", ">= 1")),
    ("--seed", "-1", ("--seed", "-1", ">= 0")),
]:
    CLI_CASES.append(C("sampling parameter out of range", ["generate", "hi", *M, flag] + ([value] if value else []),
                       words))
CLI_CASES += [
    C("sampling parameter out of range", [*TRAIN, "--out", "r1", "--lr", "nan"], ("lr", "nan", "finite")),
    C("sampling parameter out of range", [*TRAIN, "--out", "r1", "--lr", "-1"], ("lr", "-1", "> 0")),
    C("sampling parameter out of range", [*TRAIN, "--out", "r1", "--grad-clip", "inf"], ("--grad-clip", "inf")),
    C("sampling parameter out of range", [*TRAIN, "--out", "r1", "--steps", "0"], ("steps", "0", ">= 1")),
    C("sampling parameter out of range", ["eval", *M, "--data", "train.txt", "--batch-size", "0"],
      ("batch-size", "0", ">= 1")),
    C("sampling parameter out of range", ["inspect", "hi", *M, "--max-new-tokens", "0"],
      ("max-new-tokens", "0", ">= 1")),
    C("sampling parameter out of range", ["inspect", "hi", *M, "--port", "70000"], ("port", "70000", "65535")),
    C("sampling parameter out of range", ["tokenize", "--train", "train.txt", "--vocab-size", "-5", "--out", "t.json"],
      ("vocab_size=-5", "between 257")),
]
for argv, words in [
    (["generate", "hi", *M, "--temperature", "hot"], ("--temperature", "invalid float value", "'hot'")),
    (["generate", "hi", *M, "--top-k", "2.5"], ("--top-k", "invalid int value", "'2.5'")),
    (["generate", "hi", *M, "--top-p", "most"], ("--top-p", "invalid float value", "'most'")),
    (["generate", "hi", *M, "--max-new-tokens", "3.5"], ("--max-new-tokens", "invalid int value", "'3.5'")),
    (["generate", "hi", *M, "--seed", "x"], ("--seed", "invalid int value", "'x'")),
    ([*TRAIN[:-1], "--out", "r1", "--batch-size", "two"], ("--batch-size", "invalid int value", "'two'")),
    (["inspect", "hi", *M, "--port", "http"], ("--port", "invalid int value", "'http'")),
]:
    CLI_CASES.append(C("parameter of the wrong type", argv, words))
for path, words in _FILES:
    if path in ("missing.safetensors", "truncated.safetensors", "corrupt.safetensors", "pickle.pt", "tok.json",
                "plain.safetensors", "nan.safetensors", "huge-tensor.safetensors", "huge-context.safetensors",
                "folder.safetensors", "empty.safetensors", "int8.safetensors"):
        CLI_CASES.append(C("bad model or tokenizer file", ["generate", "hi", "--model", path], words))
CLI_CASES += [
    C("bad model or tokenizer file", ["train", "--data", "train.txt", "--tokenizer", "tiny.safetensors", "--out",
                                      "r-tok"], ("--tokenizer", "is a model file", "--init-from")),
    C("bad model or tokenizer file", ["eval", *M, "--data", "/dev/null"],
      ("'/dev/null'", "not a regular file or folder")),
    C("bad model or tokenizer file", ["tokenize", "--train", "/dev/null", "--vocab-size", "260", "--out", "t.json"],
      ("'/dev/null'", "not a regular file or folder")),
    C("bad model or tokenizer file", ["eval", "--model", "truncated.safetensors", "--data", "train.txt"],
      ("truncated.safetensors", "truncated")),
    C("bad model or tokenizer file", ["eval", "--model", "overflow.safetensors", "--data", "train.txt", "--seq-len",
                                      "16"],
      ("loss", "not finite")),
    C("bad model or tokenizer file", ["generate", "hi", "--model", "overflow.safetensors", "--max-new-tokens", "4"],
      ("logits", "NaN")),
    C("bad model or tokenizer file", ["export", "huge-shape.safetensors", "hf-out"],
      ("huge-shape.safetensors", "(1000000, 1000000)")),
    C("bad model or tokenizer file", ["inspect", "hi", "--model", "pickle.pt", "--html", "page.html"],
      ("pickle.pt", "pickle", "never loads")),
    C("bad model or tokenizer file", ["tokenize", "hi", "--tokenizer", "bad-tokenizer.json"],
      ("bad-tokenizer.json", "not valid JSON")),
    C("bad model or tokenizer file", ["tokenize", "hi", "--tokenizer", "truncated.safetensors"],
      ("truncated.safetensors", "truncated")),
    C("bad model or tokenizer file", ["tokenize", "hi", "--tokenizer", "missing.json"],
      ("missing.json", "No such file")),
    C("bad model or tokenizer file", [*TRAIN[:4], "deep-tokenizer.json", *TRAIN[5:], "--out", "r1"],
      ("deep-tokenizer.json", "not valid JSON")),
    C("bad model or tokenizer file", ["import-hf", "hf-pickle", "out.safetensors"],
      ("hf-pickle", "pickled", "safetensors")),
    C("bad model or tokenizer file", ["import-hf", "hf-empty", "out.safetensors"], ("hf-empty", "config.json")),
    C("bad model or tokenizer file", ["import-hf", "no-such-folder", "out.safetensors"],
      ("no-such-folder", "not a folder")),
    C("file and tokenizer disagree", ["generate", "hi", "--model", "mismatch.safetensors"],
      ("280", "vocab_size=300")),
    C("file and tokenizer disagree", ["generate", "hi", "--model", "three-layers.safetensors"],
      ("missing tensor", "layers.2")),
    C("file and tokenizer disagree", [*TRAIN, "--out", "r1", "--vocab-size", "280"],
      ("--vocab-size 280", "300")),
    C("file and tokenizer disagree", ["eval", "--model", "mismatch.safetensors", "--data", "train.txt"],
      ("280", "vocab_size=300")),
    C("output folder not writable", [*TRAIN, "--out", "ro/run"], ("'ro/run'", "'ro' is not writable")),
    C("output folder not writable", ["tokenize", "--train", "train.txt", "--vocab-size", "260", "--out",
                                     "ro/tok.json"], ("'ro/tok.json'", "'ro' is not writable")),
    C("output folder not writable", ["tokenize", "--train", "train.txt", "--vocab-size", "260", "--out",
                                     "no-such-folder/tok.json"], ("'no-such-folder'", "does not exist")),
    C("output folder not writable", ["export", "tiny.safetensors", "ro/hf"], ("'ro/hf'", "'ro' is not writable")),
    C("output folder not writable", ["inspect", "hi", *M, "--html", "ro/page.html"],
      ("'ro/page.html'", "'ro' is not writable")),
    C("output folder not writable", [*TRAIN, "--out", "tok.json"], ("tok.json",)),
    C("empty path", ["eval", "--model", "", "--data", "train.txt"], ("--model", "empty path")),
    C("empty path", ["eval", *M, "--data", "", "--seq-len", "8"], ("--data", "empty path")),
    C("empty path", [*TRAIN, "--out", ""], ("--out", "empty path")),
    C("empty path", ["export", "tiny.safetensors", ""], ("DIR", "empty path")),
    C("empty path", ["tokenize", "--train", "", "--vocab-size", "260", "--out", "t.json"], ("--train", "empty path")),
    C("empty path", ["inspect", "hi", *M, "--html", " "], ("--html", "empty path")),
    C("empty path", ["train", "--data", "train.txt", "--out", "r-init", "--init-from", ""],
      ("--init-from", "empty path")),
    C("output in the way", ["tokenize", "--train", "train.txt", "--vocab-size", "260", "--out", "/dev/null"],
      ("'/dev/null'", "not a regular file")),
    C("output in the way", ["inspect", "hi", *M, "--html", "ro", "--steps", "1"], ("'ro'", "a folder")),
    C("output in the way", ["export", "run-done/model.safetensors", "run-done"],
      ("'run-done'", "input file", "another folder")),
    C("output in the way", ["export", "tiny.safetensors", "run-done"], ("'run-done'", "training run")),
    C("output in the way", [*TRAIN, "--out", "run-done"], ("'run-done'", "already holds a run", "--resume")),
    C("output in the way", [*TRAIN, "--out", "other-model"], ("'other-model'", "model.safetensors", "another --out")),
    C("option that does not apply", ["tokenize", "hi", "--tokenizer", "tok.json", "--out", "x.json"],
      ("--out", "only with --train")),
    C("option that does not apply", ["tokenize", "--train", "train.txt", "--tokenizer", "tok.json", "--out", "y.json"],
      ("--train", "no --tokenizer")),
    C("option that does not apply", ["inspect", "hi", *M, "--steps", "3"], ("--steps", "only with --html")),
    C("option that does not apply", ["inspect", "hi", *M, "--html", "p.html", "--port", "9000"],
      ("--port", "only to the server")),
    C("option that does not apply", ["tokenize", "hi", "--tokenizer", "tok.json", "--vocab-size", "300"],
      ("--vocab-size", "only with --train", "as it is")),
    C("sampling parameter out of range", [*TRAIN, "--out", "r1", "--until", "0"], ("--until", ">= 1", "0")),
    C("disk full (simulated)", [*TRAIN, "--out", "full-cli-run"], ("full-cli-run", "disk is full"), disk_full=True),
    C("disk full (simulated)", ["tokenize", "--train", "train.txt", "--vocab-size", "260", "--out", "t-full.json"],
      ("'t-full.json'", "disk is full"), disk_full=True),
    C("disk full (simulated)", ["export", "tiny.safetensors", "hf-full-cli"], ("hf-full-cli", "disk is full"),
      disk_full=True),
    C("disk full (simulated)", ["inspect", "hi", *M, "--html", "page-full.html", "--steps", "1"],
      ("'page-full.html'", "disk is full"), disk_full=True),
]


# ----------------------------------------------------------------------------
# Tests
# ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def env():
    e = get_env()
    if not e.readonly:
        pytest.skip("no folder here refuses writes")
    return e


@pytest.mark.parametrize("case", API_CASES, ids=lambda c: c.input)
def test_api_case(case, env):
    outcome = run_case(case, env)
    assert outcome.passed, f"{case.input}: {outcome.status}: {outcome.line}\n{outcome.detail}"


@pytest.mark.parametrize("case", CLI_CASES, ids=lambda c: c.input)
def test_cli_case(case, env):
    outcome = run_case(case, env)
    assert outcome.passed, f"{case.input}: {outcome.status}: {outcome.line}\n{outcome.detail}"


def test_no_model_file_was_unpickled(env):
    """pickle.pt and hf-pickle/pytorch_model.bin unpickle to a file named 'pwned'; nothing may make it."""
    for case in API_CASES + CLI_CASES:
        if "pickle" in case.input:
            run_case(case, env)
    assert not (env.root / "pwned").exists()
