"""The bad-input inventory: its cases, how each is run, and the table in docs/reliability.md.

A :class:`Case` is one bad (or odd) input at one entry point:

- ``api``: a Python call; it must raise ``ValueError``/``TypeError`` with one line;
- ``cli``: a ``glassllm`` command line; it must exit 2 with one ``error:`` line on
  stderr (argparse's own errors print its usage first);
- ``server``: an HTTP request to the inspector; it must get HTTP 400 (404/405
  for a path or method that does not exist) and ``{"error": "<one line>"}``.

Every error line must name the bad value and what was expected (each case
lists words the line must contain). A case may also be *accepted* (a
whitespace-only prompt is valid text): then it must succeed and nothing it
returns or prints may hold a NaN. No case may end in a traceback, an
unexpected exception type, a NaN or a 5xx.

The cases live in ``test_reliability_inputs.py`` (api, cli) and
``test_reliability_server.py`` (server); they run against a small model and
files made in a temporary folder (:func:`get_env`), which is the working
directory while a case runs, so every message is the same on every machine.
``docs/reliability.md`` holds the table of every case with the line it
produced; :func:`test_doc_table_matches_the_inventory` fails when the two drift.
Regenerate the table with ``python -m tools.reliability_report --table``.
"""

from __future__ import annotations

import atexit
import contextlib
import dataclasses
import io
import json
import math
import os
import pickle
import re
import resource
import shlex
import shutil
import signal
import struct
import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "reliability.md"
TABLE_BEGIN = "<!-- BEGIN INVENTORY: python -m tools.reliability_report --table -->"
TABLE_END = "<!-- END INVENTORY -->"

# The categories of the issue, in the order the table lists them.
KINDS = (
    "empty prompt",
    "whitespace-only prompt",
    "prompt longer than the context",
    "invalid UTF-8",
    "sampling parameter out of range",
    "parameter of the wrong type",
    "token id out of range",
    "bad model or tokenizer file",
    "file and tokenizer disagree",
    "unknown snapshot, layer or head",
    "output folder not writable",
    "empty path",
    "output in the way",
    "option that does not apply",
    "disk full (simulated)",
    "malformed request",
    "request over a limit",
    "no or wrong access token",
    "cross-site request or foreign host",
)
ENTRIES = ("api", "cli", "server")


# ----------------------------------------------------------------------------
# Cases and outcomes
# ----------------------------------------------------------------------------

@dataclass(frozen=True)
class Case:
    """One input at one entry point.

    ``run``: api -- a function of the :class:`Env` that makes the call (and
    consumes any iterator); cli -- the argv list after ``glassllm``; server --
    ``(method, path, body)`` where body is a JSON-able value, or raw ``bytes``.
    ``mention``: words the error line must contain (case-insensitive): the
    value and what was expected. ``ok``: the input is valid and must succeed,
    ``note`` saying what happens. ``disk_full``: run with file writes failing.
    ``after``: a check run once the case is done (e.g. an old file is intact).
    """

    entry: str
    kind: str
    input: str
    run: Any
    mention: tuple[str, ...] = ()
    ok: bool = False
    note: str = ""
    status: int = 400
    headers: tuple[tuple[str, str], ...] = ()
    disk_full: bool = False
    after: Callable | None = None
    numeric: bool = False      # cli: stdout holds numbers, which must not be NaN
    token: bool = False        # server: the app requires INVENTORY_TOKEN (headers carry it, or not)

    def __post_init__(self):
        assert self.entry in ENTRIES, self.entry
        assert self.kind in KINDS, self.kind
        assert self.ok or self.mention, f"{self.input}: an error case must say what its line names"

    @property
    def id(self) -> str:
        return f"{self.entry}: {self.input}"


@dataclass
class Outcome:
    """What a case did. ``status``: "error" or "ok" as expected, or a failure kind."""

    status: str           # error | ok | traceback | nan | wrong
    line: str             # the one line a user sees (or what went wrong)
    detail: str = ""

    @property
    def passed(self) -> bool:
        return self.status in ("error", "ok")


# ----------------------------------------------------------------------------
# The environment: a model, tokenizers and files, in a temporary folder
# ----------------------------------------------------------------------------

@dataclass
class Env:
    root: Path
    model: Any
    tok: Any
    tok_other: Any
    readonly: bool                      # is "ro" a folder the OS refuses to write into?
    _servers: dict = field(default_factory=dict)
    extra: dict = field(default_factory=dict)

    def client(self, token: bool = False):
        """A TestClient on the inspector app (loopback Host, small limits); with ``token``, the app
        requires ``INVENTORY_TOKEN``."""
        if token not in self._servers:
            from fastapi.testclient import TestClient

            from glassllm.inspector import Inspector, Limits, create_app
            from glassllm.inspector.auth import Access, own_hosts

            inspector = Inspector(self.model, self.tok, Limits(max_prompt_tokens=32, max_new_tokens=4,
                                                              max_cells=1024))
            access = Access(INVENTORY_TOKEN if token else None, own_hosts("127.0.0.1"))
            self._servers[token] = TestClient(create_app(inspector, prompt="once upon a time", access=access),
                                              base_url="http://127.0.0.1", raise_server_exceptions=False,
                                              follow_redirects=False)
        return self._servers[token]


INVENTORY_TOKEN = "inventory-token-0123456789"
CONFIG = dict(vocab_size=300, dim=32, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=64, max_seq_len=64)
_ENV: Env | None = None


def stories(n: int, seed: int) -> str:
    """Story-like text, one story per paragraph, separated by <|endoftext|> lines."""
    rng = np.random.default_rng(seed)
    names, things = ["Tom", "Lily", "Ben", "Mia", "Sam"], ["ball", "cat", "tree", "boat", "cake", "kite"]
    out = []
    for _ in range(n):
        a, b = rng.choice(names, 2, replace=False)
        t = rng.choice(things)
        out.append(f"Once upon a time, {a} had a {t}. {a} gave the {t} to {b}. They played all day.\n"
                   "<|endoftext|>\n")
    return "".join(out)


def get_env() -> Env:
    """The shared environment (built once per process, removed at exit)."""
    global _ENV
    if _ENV is None:
        _ENV = build_env(Path(tempfile.mkdtemp(prefix="glassllm-reliability-")))
        atexit.register(_remove, _ENV.root)
    return _ENV


def _remove(root: Path) -> None:
    if (root / "ro").is_dir() and not (root / "ro").is_symlink():
        os.chmod(root / "ro", 0o755)
    shutil.rmtree(root, ignore_errors=True)


def build_env(root: Path) -> Env:
    from glassllm.checkpoint import save_model
    from glassllm.config import ModelConfig
    from glassllm.nn import Transformer
    from glassllm.tokenizer import Tokenizer

    text = stories(150, 0)
    (root / "train.txt").write_text(text, encoding="utf-8")
    tok = Tokenizer.train([text], vocab_size=300)
    tok_other = Tokenizer.train([text], vocab_size=280)
    config = ModelConfig(**CONFIG)
    model = Transformer(config, seed=0)
    rng = np.random.default_rng(1)
    model.load_state_dict({k: (1 + 0.1 * rng.standard_normal(v.shape)) if k.endswith("norm.weight")
                           else rng.standard_normal(v.shape) / math.sqrt(v.shape[-1])
                           for k, v in model.state_dict().items()})
    save_model(root / "tiny.safetensors", model, tok)
    state = model.state_dict()
    for w in ("wq", "wk"):                            # finite weights whose scores overflow float32
        state[f"layers.1.attention.{w}.weight"] = state[f"layers.1.attention.{w}.weight"] * 1e21
    overflow = Transformer(config, seed=0)
    overflow.load_state_dict(state)
    save_model(root / "overflow.safetensors", overflow, tok)
    tok.save(root / "tok.json")
    tok_other.save(root / "tok280.json")
    # Folders an output must not be written over: a training run's, and one holding some other model file.
    (root / "run-done").mkdir()
    shutil.copy(root / "tiny.safetensors", root / "run-done" / "model.safetensors")
    (root / "run-done" / "train_state.safetensors").write_bytes(b"")
    (root / "other-model").mkdir()
    shutil.copy(root / "tiny.safetensors", root / "other-model" / "model.safetensors")
    make_bad_files(root, model, tok, tok_other)
    readonly = make_readonly(root / "ro")
    return Env(root, model, tok, tok_other, readonly)


def make_readonly(path: Path) -> bool:
    """A folder the OS will not let this process write into: chmod 555, or (as root,
    whom permissions do not stop) a link to read-only sysfs. False if neither works."""
    path.mkdir()
    path.chmod(0o555)
    if _refuses_writes(path):
        return True
    path.chmod(0o755)
    path.rmdir()
    for target in ("/sys/kernel", "/sys"):
        if Path(target).is_dir() and _refuses_writes(Path(target)):
            path.symlink_to(target)
            return True
    path.mkdir()
    return False


def _refuses_writes(folder: Path) -> bool:
    try:
        fd, tmp = tempfile.mkstemp(dir=folder)
    except OSError:
        return True
    os.close(fd)
    os.unlink(tmp)
    return False


# -- crafted model files ------------------------------------------------------

def safetensors_bytes(header: dict, data: bytes = b"") -> bytes:
    """A safetensors file from a header dict (tensors and ``__metadata__``) and its data."""
    raw = json.dumps(header).encode("utf-8")
    raw += b" " * (-len(raw) % 8)
    return struct.pack("<Q", len(raw)) + raw + data


def parse_safetensors(blob: bytes) -> tuple[dict, bytes]:
    n = struct.unpack("<Q", blob[:8])[0]
    return json.loads(blob[8:8 + n]), blob[8 + n:]


def rewrite(blob: bytes, edit_header=None, edit_meta=None, tensors=None) -> bytes:
    """``blob`` with its header or metadata edited, or some tensors replaced ({name: array or None})."""
    header, data = parse_safetensors(blob)
    meta = header.pop("__metadata__")
    arrays = {}
    for name, info in header.items():
        lo, hi = info["data_offsets"]
        arrays[name] = np.frombuffer(data[lo:hi], dtype={"F32": "<f4", "F64": "<f8"}[info["dtype"]]
                                     ).reshape(info["shape"])
    for name, value in (tensors or {}).items():
        if value is None:
            arrays.pop(name)
        else:
            arrays[name] = value
    if edit_meta:
        edit_meta(meta)
    new_header, out, offset = {}, b"", 0
    for name, a in arrays.items():
        a = np.ascontiguousarray(a, dtype="<f4")
        new_header[name] = {"dtype": "F32", "shape": list(a.shape), "data_offsets": [offset, offset + a.nbytes]}
        out += a.tobytes()
        offset += a.nbytes
    if edit_header:
        edit_header(new_header)
    return safetensors_bytes({"__metadata__": meta, **new_header}, out)


class _Unpickled:
    """Unpickling this writes the file ``pwned``: proof that something unpickled a model file."""

    def __reduce__(self):
        return (open, ("pwned", "w"))


def make_bad_files(root: Path, model, tok, tok_other) -> None:
    good = (root / "tiny.safetensors").read_bytes()
    files = {
        "empty.safetensors": b"",
        "short.safetensors": b"\x05\x00\x00",
        "truncated.safetensors": good[: len(good) // 2],
        "header-only.safetensors": good[: 8 + struct.unpack("<Q", good[:8])[0]],
        "corrupt.safetensors": good[:8] + b"\xff" * 24 + good[32:],
        "pickle.pt": pickle.dumps({"weights": _Unpickled()}),
        "version2.safetensors": rewrite(good, edit_meta=lambda m: m.update(version="2")),
        "nan.safetensors": rewrite(good, tensors={"norm.weight": np.full(CONFIG["dim"], np.nan)}),
        "huge-tensor.safetensors": rewrite(good, edit_header=lambda h: h["tok_embeddings.weight"].update(
            shape=[1_000_000, 1_000_000], data_offsets=[0, 4 * 10**12])),
        "huge-shape.safetensors": rewrite(good, edit_header=lambda h: h["tok_embeddings.weight"].update(
            shape=[1_000_000, 1_000_000])),
        "huge-context.safetensors": rewrite(good, edit_meta=lambda m: m.update(
            config=json.dumps({**CONFIG, "max_seq_len": 10**9}))),
        "huge-config.safetensors": rewrite(good, edit_meta=lambda m: m.update(
            config=json.dumps({**CONFIG, "dim": 2**20, "ffn_dim": 2**22}))),
        "int8.safetensors": rewrite(good, edit_header=lambda h: h["norm.weight"].update(dtype="I8")),
        "wrong-shape.safetensors": rewrite(good, tensors={"output.weight": np.zeros((300, 16))}),
        "missing-tensor.safetensors": rewrite(good, tensors={"output.weight": None}),
        "extra-tensor.safetensors": rewrite(good, tensors={"lm_head.weight": np.zeros((2, 2))}),
        "bad-config.safetensors": rewrite(good, edit_meta=lambda m: m.update(
            config=json.dumps({**CONFIG, "norm_eps": "tiny"}))),
        "deep.safetensors": struct.pack("<Q", 5000) + b"[" * 5000,        # JSON nested 5,000 deep
        "mismatch.safetensors": rewrite(good, edit_meta=lambda m: m.update(tokenizer=tok_other.to_json())),
        "three-layers.safetensors": rewrite(good, edit_meta=lambda m: m.update(
            config=json.dumps({**CONFIG, "n_layers": 3}))),
        "bad-tokenizer.json": b'{"format": "glassllm-tokenizer", "version": 1, "merges": [[',
        "deep-tokenizer.json": b"[" * 100_000,
        "not-utf8.txt": b"Once upon a time \xff\xfe\x80 the end.\n",
    }
    from safetensors.numpy import save

    files["plain.safetensors"] = save({"weight": np.zeros((2, 2), dtype=np.float32)})   # not glassllm's
    for name, blob in files.items():
        (root / name).write_bytes(blob)
    (root / "folder.safetensors").mkdir()
    # A Hugging Face folder whose weights are pickled (a real export, its safetensors swapped for a
    # pickle), and one with no config.
    from glassllm.hf import export_hf

    export_hf(root / "tiny.safetensors", root / "hf-pickle")
    (root / "hf-pickle" / "model.safetensors").unlink()
    (root / "hf-pickle" / "pytorch_model.bin").write_bytes(pickle.dumps({"w": _Unpickled()}))
    (root / "hf-empty").mkdir()


# ----------------------------------------------------------------------------
# Simulated faults
# ----------------------------------------------------------------------------

@contextlib.contextmanager
def disk_full():
    """Every write to a regular file fails, as on a full disk.

    The kernel enforces it: RLIMIT_FSIZE is lowered to 0 bytes (only the soft
    limit, so it can be raised back), and SIGXFSZ is ignored, so ``write``
    fails with EFBIG instead of killing the process. Reads work as before.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (0, hard))
    try:
        yield
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old)


# ----------------------------------------------------------------------------
# Running cases
# ----------------------------------------------------------------------------

_NAN_TEXT = re.compile(r"(?i)(?<![a-z])[-+]?(nan|inf)(?![a-z])")


def has_nan(x, depth: int = 0) -> bool:
    """Does ``x`` (arrays, numbers, containers, dataclasses, inspector JSON) hold a NaN?"""
    if depth > 20:
        return False
    if isinstance(x, np.ndarray):
        return x.dtype.kind in "fc" and bool(np.isnan(x).any())
    if isinstance(x, (float, np.floating)):
        return math.isnan(x)
    if dataclasses.is_dataclass(x) and not isinstance(x, type):
        return any(has_nan(getattr(x, f.name), depth + 1) for f in dataclasses.fields(x))
    if isinstance(x, dict):
        if set(x) >= {"dtype", "shape", "b64"}:
            return has_nan(decode_array(x))
        return any(has_nan(v, depth + 1) for v in x.values())
    if isinstance(x, (list, tuple)):
        return any(has_nan(v, depth + 1) for v in x)
    if hasattr(x, "steps") and hasattr(x, "names"):                    # a Trace
        return any(has_nan(np.asarray(v), depth + 1) for s in x.steps for v in [*s.values.values(),
                                                                              *s.grads.values()])
    return False


def decode_array(enc: dict) -> np.ndarray:
    import base64

    dtype = {"float32": "<f4", "float64": "<f8", "uint8": "u1"}[enc["dtype"]]
    return np.frombuffer(base64.b64decode(enc["b64"]), dtype=dtype).reshape(enc["shape"])


MAX_ERROR_CHARS = 2000  # a line a person reads: an error never echoes a whole request back


def _one_line(text: str) -> bool:
    return bool(text.strip()) and "\n" not in text.strip() and len(text.strip()) <= MAX_ERROR_CHARS


def _mentions(case: Case, line: str) -> str:
    """'' if the line names everything the case asks for, else what it lacks."""
    missing = [w for w in case.mention if w.lower() not in line.lower()]
    return f"does not mention {missing}" if missing else ""


@contextlib.contextmanager
def _in(env: Env, case: Case):
    old = os.getcwd()
    os.chdir(env.root)
    try:
        with (disk_full() if case.disk_full else contextlib.nullcontext()):
            yield
    finally:
        os.chdir(old)


_OUTCOMES: dict[str, Outcome] = {}


def run_case(case: Case, env: Env) -> Outcome:
    """Run one case in-process and judge it (see the module docstring); each case runs once per process."""
    if case.id not in _OUTCOMES:
        _OUTCOMES[case.id] = _run_case(case, env)
    return _OUTCOMES[case.id]


def _run_case(case: Case, env: Env) -> Outcome:
    runner = {"api": _run_api, "cli": _run_cli, "server": _run_server}[case.entry]
    out = runner(case, env)
    if out.passed and case.after is not None:
        old = os.getcwd()
        os.chdir(env.root)
        try:
            case.after(env)
        except Exception as e:  # noqa: BLE001 -- a failed check is an outcome
            out = Outcome("wrong", f"after-check failed: {type(e).__name__}: {e}")
        finally:
            os.chdir(old)
    return out


def _run_api(case: Case, env: Env) -> Outcome:
    import traceback

    try:
        with _in(env, case):
            result = case.run(env)
    except (ValueError, TypeError) as e:
        line = f"{type(e).__name__}: {e}"
        if case.ok:
            return Outcome("wrong", f"valid input refused: {line}")
        if not _one_line(str(e)):
            return Outcome("wrong", f"not one line: {line!r}")
        lacks = _mentions(case, str(e))
        return Outcome("wrong", f"{line} -- {lacks}") if lacks else Outcome("error", line)
    except BaseException as e:  # noqa: BLE001 -- anything else is a traceback for the user
        if isinstance(e, KeyboardInterrupt):
            raise
        return Outcome("traceback", f"{type(e).__name__}: {e}", traceback.format_exc())
    if not case.ok:
        return Outcome("wrong", f"accepted, expected an error (returned {type(result).__name__})")
    if has_nan(result):
        return Outcome("nan", "the result holds a NaN")
    return Outcome("ok", case.note)


def _run_cli(case: Case, env: Env) -> Outcome:
    import traceback

    from glassllm.cli import main

    out, err = io.StringIO(), io.StringIO()
    try:
        with _in(env, case), contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(list(case.run))
            except SystemExit as e:                                        # argparse
                code = e.code if isinstance(e.code, int) else 2
    except BaseException as e:  # noqa: BLE001
        if isinstance(e, KeyboardInterrupt):
            raise
        return Outcome("traceback", f"{type(e).__name__}: {e}", traceback.format_exc())
    return judge_cli(case, code, out.getvalue(), err.getvalue())


def judge_cli(case: Case, code: int, stdout: str, stderr: str) -> Outcome:
    """Judge a command's exit code and output (in-process or a real subprocess)."""
    if "Traceback" in stderr or "Traceback" in stdout:
        return Outcome("traceback", stderr.strip().splitlines()[-1] if stderr.strip() else "", stderr)
    lines = stderr.strip().splitlines()
    if case.ok:
        if code != 0:
            return Outcome("wrong", f"valid input refused (exit {code}): {lines[-1] if lines else ''}")
        if case.numeric and _NAN_TEXT.search(stdout):
            return Outcome("nan", "the output holds a NaN", stdout)
        return Outcome("ok", case.note)
    if code != 2:
        return Outcome("wrong", f"exit code {code}, expected 2: {lines[-1] if lines else stdout[-200:]}")
    errors = [ln for ln in lines if ": error: " in ln]
    usage = lines and lines[0].startswith("usage:")
    if len(errors) != 1 or (len(lines) != 1 and not usage) or not lines[-1].startswith("glassllm"):
        return Outcome("wrong", f"not one error line: {stderr!r}")
    lacks = _mentions(case, errors[0])
    return Outcome("wrong", f"{errors[0]} -- {lacks}") if lacks else Outcome("error", errors[0])


def _run_server(case: Case, env: Env) -> Outcome:
    method, path, body = case.run
    client = env.client(case.token)
    headers = dict(case.headers)
    with _in(env, case):
        if isinstance(body, tuple) and body[0] == "chunked":               # no Content-Length
            r = client.request(method, path, content=iter(body[1]), headers={"content-type": "application/json",
                                                                             **headers})
        elif isinstance(body, (bytes, str)):
            r = client.request(method, path, content=body, headers={"content-type": "application/json",
                                                                     **headers})
        elif body is None:
            r = client.request(method, path, headers=headers)
        else:
            r = client.request(method, path, json=body, headers=headers)
    return judge_response(case, r.status_code, r.headers.get("content-type", ""), r.text)


def judge_response(case: Case, status: int, content_type: str, text: str) -> Outcome:
    if status >= 500:
        return Outcome("traceback", f"HTTP {status}: {text[:200]}")
    try:
        body = json.loads(text)
    except ValueError:
        return Outcome("wrong", f"HTTP {status} with a body that is not JSON: {text[:100]!r}")
    if case.ok:
        if status != 200:
            return Outcome("wrong", f"valid request refused: HTTP {status} {text[:200]}")
        if has_nan(body):
            return Outcome("nan", "the response holds a NaN")
        return Outcome("ok", case.note)
    if status != case.status or not content_type.startswith("application/json"):
        return Outcome("wrong", f"HTTP {status} ({content_type}), expected {case.status}: {text[:200]}")
    if not (isinstance(body, dict) and set(body) == {"error"} and isinstance(body["error"], str)
            and _one_line(body["error"])):
        return Outcome("wrong", f"HTTP {status} body is not {{'error': one line}}: {text[:200]}")
    line = f"{status} {body['error']}"
    lacks = _mentions(case, body["error"])
    return Outcome("wrong", f"{line} -- {lacks}") if lacks else Outcome("error", line)


# ----------------------------------------------------------------------------
# The inventory and its table
# ----------------------------------------------------------------------------

def all_cases() -> list[Case]:
    """Every case, in table order (by kind, then entry point, then as written)."""
    from tests import test_reliability_inputs as inputs
    from tests import test_reliability_server as server

    cases = [*inputs.API_CASES, *inputs.CLI_CASES, *server.SERVER_CASES]
    ids = [c.id for c in cases]
    assert len(ids) == len(set(ids)), [i for i in ids if ids.count(i) > 1]
    return sorted(cases, key=lambda c: (KINDS.index(c.kind), ENTRIES.index(c.entry)))


def counts(cases: list[Case]) -> dict[str, dict[str, int]]:
    """kind -> entry -> number of cases."""
    out = {k: dict.fromkeys(ENTRIES, 0) for k in KINDS}
    for c in cases:
        out[c.kind][c.entry] += 1
    return out


def _cell(text: str) -> str:
    """Text as a code span in a table cell: exactly what the user sees, nothing Markdown could misread."""
    text = text.replace("\n", " ").replace("`", "'")
    assert "|" not in text, text
    return f"`{text}`"


def render_table(cases: list[Case], outcomes: list[Outcome]) -> str:
    """The inventory as Markdown: a count per kind and entry point, then every case with its line."""
    per = counts(cases)
    lines = ["| kind of bad input | api | cli | server |", "|---|---:|---:|---:|"]
    for kind, row in per.items():
        lines.append(f"| {kind} | {row['api']} | {row['cli']} | {row['server']} |")
    totals = {e: sum(row[e] for row in per.values()) for e in ENTRIES}
    lines.append(f"| **total** | **{totals['api']}** | **{totals['cli']}** | **{totals['server']}** |")
    lines += ["", "| # | entry | kind | input | what the user gets |", "|---:|---|---|---|---|"]
    for i, (c, o) in enumerate(zip(cases, outcomes), 1):
        got = f"accepted: {o.line}" if c.ok else _cell(o.line)
        lines.append(f"| {i} | {c.entry} | {c.kind} | {_cell(c.input)} | {got} |")
    return "\n".join(lines) + "\n"


def doc_table(text: str) -> str:
    if TABLE_BEGIN not in text or TABLE_END not in text:
        raise ValueError(f"{DOC} lacks the markers {TABLE_BEGIN!r} ... {TABLE_END!r}")
    return text.split(TABLE_BEGIN, 1)[1].split(TABLE_END, 1)[0].strip("\n") + "\n"


def replace_doc_table(text: str, table: str) -> str:
    head, rest = text.split(TABLE_BEGIN, 1)
    _, tail = rest.split(TABLE_END, 1)
    return f"{head}{TABLE_BEGIN}\n{table}{TABLE_END}{tail}"


def shell(argv: list[str]) -> str:
    """A command line as a user would type it (invalid UTF-8 shown as $'\\xNN')."""
    parts = []
    for a in ["glassllm", *argv]:
        if any("\udc80" <= ch <= "\udcff" for ch in a):
            parts.append("$'" + "".join(f"\\x{ord(ch) - 0xdc00:02x}" if "\udc80" <= ch <= "\udcff" else ch
                                        for ch in a) + "'")
        elif len(a) > 60:                                                  # a long prompt, abridged
            parts.append(f"<{a[:17]!r} x {-(-len(a) // 17)}>")
        else:
            parts.append(shlex.quote(a))
    return " ".join(parts)


# ----------------------------------------------------------------------------
# Tests: the doc's table is the inventory's
# ----------------------------------------------------------------------------

def test_every_kind_is_tried_at_an_entry_point():
    per = counts(all_cases())
    assert all(sum(row.values()) for row in per.values()), [k for k, row in per.items() if not sum(row.values())]


def test_doc_table_matches_the_inventory():
    """Every case runs (the tests in _inputs and _server judge them); the doc must list exactly these lines."""
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    env = get_env()
    if not env.readonly:
        pytest.skip("no folder here refuses writes (the non-writable cases' lines would differ)")
    cases = all_cases()
    outcomes = [run_case(c, env) for c in cases]
    failed = [(c.id, o.line) for c, o in zip(cases, outcomes) if not o.passed]
    assert not failed, failed
    want = render_table(cases, outcomes)
    got = doc_table(DOC.read_text(encoding="utf-8"))
    if got != want:
        import difflib
        diff = "\n".join(difflib.unified_diff(got.splitlines(), want.splitlines(), "docs/reliability.md",
                                              "the inventory", lineterm="", n=0))
        pytest.fail("docs/reliability.md's table differs from the inventory; regenerate it with "
                    f"`python -m tools.reliability_report --table`:\n{diff}")


def test_the_classroom_figures_are_the_load_tests_results():
    """docs/reliability.md's classroom figures are rendered from bench/results/classroom.json, unedited."""
    import importlib.util

    path = ROOT / "tools" / "reliability_report.py"
    spec = importlib.util.spec_from_file_location("reliability_report", path)
    report = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(report)
    results = json.loads(report.CLASSROOM.read_text(encoding="utf-8"))
    text = DOC.read_text(encoding="utf-8")
    got = text.split(report.CLASSROOM_BEGIN, 1)[1].split(report.CLASSROOM_END, 1)[0].strip("\n") + "\n"
    assert got == report.classroom_markdown(results), (
        "docs/reliability.md's classroom figures differ from bench/results/classroom.json; "
        "regenerate them with `python -m tools.reliability_report --classroom`")
