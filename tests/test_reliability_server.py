"""The inspector's server under bad requests, under load, and bound beyond this machine.

- Every case of ``SERVER_CASES`` (bad bodies, values, names, limits; a few
  valid odd ones) gets HTTP 400 (404/405 for a path or method that does not
  exist) with ``{"error": "<one line>"}`` naming the value -- never a 5xx.
- A short load test: a real uvicorn server on 127.0.0.1 in a child process,
  concurrent clients sending a mix of valid and bad requests for a few
  seconds: no 5xx, every answer what its request deserves, bounded memory.
  ``tools/reliability_report.py`` runs the full one (20 clients x 30 s).
- ``glassllm inspect --host`` with a non-loopback address prints a warning
  (checked without opening a socket to the network).
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest

from tests.test_reliability_inventory import INVENTORY_TOKEN, Case, get_env, run_case

LONG = "once upon a time " * 40
S = "server"
P = "once upon a time"


def req(path, body, method="POST"):
    return (method, path, body)


def nxt(**body):
    return req("/api/next", {"prompt": P, **body})


def snap(**body):
    return req("/api/snapshot", {"prompt": P, "name": "attn.softmax", "layer": 0, "head": 0, **body})


def srv(kind, text, run, mention=(), **kw) -> Case:
    return Case(S, kind, text, run, mention, **kw)


SERVER_CASES = [
    srv("empty prompt", 'POST /api/tokens {"prompt": ""}', req("/api/tokens", {"prompt": ""}), ("prompt", "empty")),
    srv("empty prompt", 'POST /api/next {"prompt": ""}', req("/api/next", {"prompt": ""}), ("prompt", "empty")),
    srv("empty prompt", 'POST /api/snapshot {"prompt": "", "name": "embed"}',
        req("/api/snapshot", {"prompt": "", "name": "embed"}), ("prompt", "empty")),
    srv("whitespace-only prompt", 'POST /api/tokens {"prompt": "   "}', req("/api/tokens", {"prompt": "   "}),
        ok=True, note="valid text: its ids and pieces"),
    srv("whitespace-only prompt", 'POST /api/next {"prompt": " \\n"}', req("/api/next", {"prompt": " \n"}),
        ok=True, note="finite logits and survivors"),
    srv("whitespace-only prompt", 'POST /api/snapshot {"prompt": "  ", attn.softmax layer 0 head 0}',
        req("/api/snapshot", {"prompt": "  ", "name": "attn.softmax", "layer": 0, "head": 0}), ok=True,
        note="a finite (n, m) slice"),
    srv("prompt longer than the context", "POST /api/next {prompt: 'once upon a time ' * 40}",
        req("/api/next", {"prompt": LONG}), ("tokens", "at most 32")),
    srv("prompt longer than the context", "POST /api/snapshot {prompt: 'once upon a time ' * 40, ...}",
        snap(prompt=LONG), ("tokens", "at most 32")),
    srv("invalid UTF-8", "POST /api/tokens with body bytes {\"prompt\": \"\\xff\"}",
        req("/api/tokens", b'{"prompt": "\xff"}'), ("not valid JSON",)),
    srv("invalid UTF-8", 'POST /api/tokens {"prompt": "\\udcff"} (a lone surrogate, escaped)',
        req("/api/tokens", b'{"prompt": "\\udcff"}'), ("prompt", "valid string")),
    srv("invalid UTF-8", 'POST /api/tokens {"prompt": "a\\u0000b"} (a NUL character)',
        req("/api/tokens", b'{"prompt": "a\\u0000b"}'), ok=True, note="valid text: NUL is a byte like any other"),
]
for field, raw, words in [
    ("temperature", "-1", ("temperature", "greater than or equal to 0", "-1")),
    ("temperature", "101", ("temperature", "less than or equal to 100", "101")),
    ("temperature", "NaN", ("temperature", "finite", "nan")),
    ("temperature", "Infinity", ("temperature", "finite", "inf")),
    ("temperature", "1e999", ("temperature", "finite", "inf")),
    ("top_k", "0", ("top_k", "greater than or equal to 1", "0")),
    ("top_k", "-1", ("top_k", "greater than or equal to 1", "-1")),
    ("top_k", "301", ("top_k 301", "300 ids")),
    ("top_p", "0", ("top_p", "greater than 0", "0")),
    ("top_p", "1.5", ("top_p", "less than or equal to 1", "1.5")),
    ("top_p", "NaN", ("top_p", "finite", "nan")),
    ("step", "-1", ("step", "greater than or equal to 0", "-1")),
]:
    SERVER_CASES.append(srv("sampling parameter out of range", f'POST /api/next {{"{field}": {raw}}}',
                            req("/api/next", f'{{"prompt": "{P}", "{field}": {raw}}}'.encode()), words))
for iv, words in [
    ({"kind": "temperature", "layer": 0, "temperature": 0}, ("intervention temperature 0.0", "[0.001, 100]")),
    ({"kind": "temperature", "layer": 0, "temperature": 1e-40}, ("intervention temperature 1e-40", "[0.001, 100]")),
    ({"kind": "temperature", "layer": 0, "temperature": -2}, ("intervention temperature -2", "[0.001, 100]")),
    ({"kind": "temperature", "layer": 0, "temperature": 1000}, ("intervention temperature 1000", "[0.001, 100]")),
]:
    SERVER_CASES.append(srv("sampling parameter out of range", f"POST /api/next {{intervention: {json.dumps(iv)}}}",
                            nxt(intervention=iv), words))
for field, value, words in [
    ("temperature", "hot", ("temperature", "'hot'", "number")),
    ("temperature", True, ("temperature", "True", "number")),
    ("temperature", None, ("temperature", "None", "number")),
    ("temperature", [1], ("temperature", "[1]", "number")),
    ("top_k", 2.5, ("top_k", "2.5", "integer")),
    ("top_k", "3", ("top_k", "'3'", "integer")),
    ("top_k", True, ("top_k", "True", "integer")),
    ("top_p", "x", ("top_p", "'x'", "number")),
    ("step", "1", ("step", "'1'", "integer")),
    ("step", 1.5, ("step", "1.5", "integer")),
    ("prompt", 5, ("prompt", "5", "string")),
    ("prompt", None, ("prompt", "None", "string")),
    ("prompt", ["a"], ("prompt", "['a']", "string")),
    ("intervention", "ablate", ("intervention", "'ablate'", "dictionary")),
    ("intervention", {"kind": "explode", "layer": 0}, ("intervention.kind", "'explode'", "'ablate'")),
]:
    SERVER_CASES.append(srv("parameter of the wrong type", f"POST /api/next {{{json.dumps(field)}: {json.dumps(value)}}}",
                            nxt(**{field: value}), words))
for field, value, words in [
    ("layer", "0", ("layer", "'0'", "integer")),
    ("layer", 0.5, ("layer", "0.5", "integer")),
    ("head", True, ("head", "True", "integer")),
    ("grad", "yes", ("grad", "'yes'", "boolean")),
    ("grad", 1, ("grad", "1", "boolean")),
    ("name", 5, ("name", "5", "string")),
    ("name", None, ("name", "None", "string")),
    ("target", "3", ("target", "'3'", "integer")),
]:
    SERVER_CASES.append(srv("parameter of the wrong type",
                            f"POST /api/snapshot {{{json.dumps(field)}: {json.dumps(value)}}}",
                            snap(**{field: value}), words))
SERVER_CASES += [
    srv("token id out of range", 'POST /api/snapshot {"grad": true, "target": 300}',
        snap(grad=True, target=300), ("target 300", "[0, 300)")),
    srv("token id out of range", 'POST /api/snapshot {"grad": true, "target": -1}',
        snap(grad=True, target=-1), ("target", "-1", "greater than or equal to 0")),
    srv("token id out of range", 'POST /api/snapshot {"grad": true, "target": 10**30}',
        snap(grad=True, target=10**30), ("target", "1000000000000000000000000000000")),
    srv("token id out of range", 'POST /api/snapshot {"target": 5} (no grad: nothing is differentiated)',
        snap(target=5), ("target 5", "grad true")),
]
for body, words in [
    ({"name": "attn.nope"}, ("'attn.nope'", "expected one of")),
    ({"name": "layers.0.attn.q"}, ("'layers.0.attn.q'", "expected one of")),
    ({"layer": 2}, ("layer 2", "0..1")),
    ({"layer": -1}, ("layer", "-1", "greater than or equal to 0")),
    ({"layer": None}, ("'attn.softmax'", "send a layer in 0..1")),
    ({"name": "logits", "layer": 0, "head": None}, ("'logits'", "outside the layers")),
    ({"head": 4}, ("head 4", "0..3")),
    ({"name": "attn.k", "head": 2}, ("head 2", "0..1")),
    ({"name": "resid_post", "head": 0}, ("'resid_post'", "no head axis")),
    ({"head": None}, ("4 heads", "0..3")),
    ({"intervention": {"kind": "ablate", "layer": 5, "head": 0}}, ("intervention layer=5", "0..1")),
    ({"intervention": {"kind": "ablate", "layer": 0, "head": 9}}, ("intervention head=9", "0..3")),
    ({"intervention": {"kind": "ablate", "layer": 0}}, ("'ablate'", "needs a head")),
    ({"intervention": {"kind": "mask_off", "layer": 0, "head": 1}}, ("'mask_off'", "head null")),
    ({"intervention": {"kind": "temperature", "layer": 0}}, ("'temperature'", "needs a temperature")),
]:
    shown = ", ".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in body.items())
    SERVER_CASES.append(srv("unknown snapshot, layer or head", f"POST /api/snapshot {{{shown}}}", snap(**body), words))
SERVER_CASES += [
    srv("malformed request", "POST /api/next with body '{'", req("/api/next", b"{"), ("not valid JSON",)),
    srv("malformed request", "POST /api/next with body '[]'", req("/api/next", b"[]"), ("JSON object",)),
    srv("malformed request", "POST /api/next with body '\"hi\"'", req("/api/next", b'"hi"'), ("JSON object",)),
    srv("malformed request", "POST /api/next with an empty body", req("/api/next", b""), ("body",)),
    srv("malformed request", "POST /api/next {} (no prompt)", req("/api/next", {}), ("missing field 'prompt'",)),
    srv("malformed request", 'POST /api/next {"prompt": "hi", "bogus": 1}',
        req("/api/next", {"prompt": "hi", "bogus": 1}), ("unknown field 'bogus'",)),
    srv("malformed request", "POST /api/next with 10,000 nested brackets", req("/api/next", b"[" * 10000),
        ("not valid JSON",)),
    srv("malformed request", 'POST /api/next {"step": <5,000 digits>}',
        req("/api/next", b'{"prompt": "hi", "step": ' + b"9" * 5000 + b"}"), ("not valid JSON", "4,300 digits")),
    srv("malformed request", "POST /api/tokens with Content-Type: text/plain",
        req("/api/tokens", b'{"prompt": "hi"}'), ("Content-Type", "application/json", "'text/plain'"),
        headers=(("content-type", "text/plain"),)),
    srv("malformed request", "POST /api/snapshot {layer: [1] * 50,000} (the error quotes 40 characters of it)",
        snap(layer=[1] * 50_000), ("layer", "integer", "[1, 1, 1")),
    srv("malformed request", "POST /api/tokens/ (a trailing slash)", req("/api/tokens/", {"prompt": "hi"}),
        ("/api/tokens/",), status=404),
    srv("malformed request", "POST /api/next, chunked body (no Content-Length)",
        req("/api/next", ("chunked", [b'{"prompt": ', b'"hi"}'])), ("Content-Length",)),
    srv("malformed request", "GET /api/nope", req("/api/nope", None, "GET"), ("/api/nope",), status=404),
    srv("malformed request", "GET /../../etc/passwd", req("/../../etc/passwd", None, "GET"), ("no such page",),
        status=404),
    srv("malformed request", "PUT /api/tokens", req("/api/tokens", {"prompt": "hi"}, "PUT"),
        ("PUT", "/api/tokens"), status=405),
    srv("malformed request", "GET /openapi.json (no API docs are served)", req("/openapi.json", None, "GET"),
        ("/openapi.json",), status=404),
    srv("request over a limit", "POST /api/tokens {prompt of 20,001 characters}",
        req("/api/tokens", {"prompt": "a" * 20001}), ("prompt", "20000")),
    srv("request over a limit", "POST /api/tokens with a 300 KB body",
        req("/api/tokens", {"prompt": "a", "pad": "x" * 300_000}), ("300", "too large", "262144"), status=413),
    srv("request over a limit", 'POST /api/snapshot {"name": "logits"} (5 x 300 values)',
        snap(name="logits", layer=None, head=None), ("1500", "at most 1024")),
    srv("request over a limit", 'POST /api/next {"step": 5} (4 steps allowed)', nxt(step=5),
        ("step 5", "4 generation steps")),
    srv("request over a limit", 'POST /api/snapshot {"step": 9}', snap(step=9), ("step 9", "4 generation steps")),
    srv("request over a limit", 'POST /api/snapshot {"grad": true, "step": 1}', snap(grad=True, step=1),
        ("step 0", "got step 1")),
]

BEARER = ("authorization", f"Bearer {INVENTORY_TOKEN}")
SERVER_CASES += [
    srv("no or wrong access token", "GET /api/info without the token", req("/api/info", None, "GET"),
        ("access token",), status=401, token=True),
    srv("no or wrong access token", "POST /api/next with a wrong token in Authorization", nxt(),
        ("access token",), status=401, token=True, headers=(("authorization", "Bearer not-the-token"),)),
    srv("no or wrong access token", "POST /api/snapshot with the token itself as the cookie", snap(),
        ("access token",), status=401, token=True,
        headers=(("cookie", f"glassllm-abc={INVENTORY_TOKEN}"),)),
    srv("no or wrong access token", "GET /api/info?token=<wrong>", req("/api/info?token=wrong-token", None, "GET"),
        ("access token",), status=401, token=True),
    srv("no or wrong access token", "GET /api/info with the token (Authorization: Bearer)",
        req("/api/info", None, "GET"), ok=True, note="the model's shape and names", token=True, headers=(BEARER,)),
    srv("cross-site request or foreign host", "POST /api/next with Host: evil.example", nxt(),
        ("'evil.example'", "not this server's name"), headers=(("host", "evil.example"),), status=403),
    srv("cross-site request or foreign host", "POST /api/next with the token and Origin: http://evil.example", nxt(),
        ("cross-site",), status=403, token=True, headers=(BEARER, ("origin", "http://evil.example"))),
    srv("cross-site request or foreign host", "GET /api/info with the token and Sec-Fetch-Site: cross-site",
        req("/api/info", None, "GET"), ("cross-site",), status=403, token=True,
        headers=(BEARER, ("sec-fetch-site", "cross-site"))),
    srv("cross-site request or foreign host", "POST /api/tokens with Origin: null (a sandboxed page)",
        req("/api/tokens", {"prompt": "hi"}), ("cross-site",), status=403, headers=(("origin", "null"),)),
]


# ----------------------------------------------------------------------------
# The cases
# ----------------------------------------------------------------------------

@pytest.fixture(scope="module")
def env():
    pytest.importorskip("fastapi")
    pytest.importorskip("httpx")
    return get_env()


@pytest.mark.parametrize("case", SERVER_CASES, ids=lambda c: c.input)
def test_server_case(case, env):
    outcome = run_case(case, env)
    assert outcome.passed, f"{case.input}: {outcome.status}: {outcome.line}\n{outcome.detail}"


# ----------------------------------------------------------------------------
# Load: a real server on 127.0.0.1, many clients, a mix of requests
# ----------------------------------------------------------------------------

# The server's process: serve the model file on 127.0.0.1 (any free port), print the port, and stop
# by itself after ``lifetime`` seconds even if nobody stops it.
SERVER_CHILD = textwrap.dedent("""
    import sys, time
    from glassllm.checkpoint import load_model
    from glassllm.inspector import Inspector, Limits, create_app
    from glassllm.inspector.server import Server

    path, lifetime = sys.argv[1], float(sys.argv[2])
    model, tok, meta = load_model(path)
    server = Server(create_app(Inspector(model, tok, Limits()), prompt="once upon a time"), "127.0.0.1", 0)
    server.start()
    print(server.port, flush=True)
    end = time.monotonic() + lifetime
    while time.monotonic() < end and server.thread.is_alive():
        time.sleep(0.2)
    server.stop()
""")

WORDS = ("once upon a time there was a little dog cat bird who liked to run jump play sing in the park "
         "garden house tree with her his friend mom big small red happy sad day sun").split()


def make_model_file(folder: Path, shape: str = "tiny") -> Path:
    """A model file for the load test: ``tiny`` (the inventory's) or ``bundled`` (the bundled model's
    shape: 4 layers, width 128, 1,024 ids; random weights of a trained-like scale)."""
    if shape == "tiny":
        return get_env().root / "tiny.safetensors"
    from glassllm.checkpoint import save_model
    from glassllm.config import ModelConfig
    from glassllm.nn import Transformer
    from glassllm.tokenizer import Tokenizer
    from tests.support.glassllm_testing import randomize

    rng = np.random.default_rng(0)
    made_up = ["".join(rng.choice(list("abcdefghijklmnopqrstuvwxyz"), size=rng.integers(2, 9)))
               for _ in range(600)]
    text = " ".join(rng.choice(made_up + WORDS, size=20000))
    tok = Tokenizer.train([text], vocab_size=1024)
    model = randomize(Transformer(ModelConfig(), seed=0), np.random.default_rng(1))
    path = folder / "bundled-shape.safetensors"
    save_model(path, model, tok)
    return path


def _requests(rng: np.random.Generator, info: dict, prompts: list[str]):
    """One request of the mix: (kind, path, body, expected status)."""
    prompt = prompts[rng.integers(len(prompts))]
    names = info["names"]
    layers, heads = info["model"]["n_layers"], info["model"]["n_heads"]
    r = rng.random()
    if r < 0.15:
        return "tokens", "/api/tokens", {"prompt": prompt}, 200
    if r < 0.45:                                                         # inspect: a snapshot
        entry = names[rng.integers(len(names))]
        body = {"prompt": prompt, "name": entry["name"],
                "layer": int(rng.integers(layers)) if entry["in_layer"] else None,
                "head": int(rng.integers(entry["heads"])) if entry["heads"] else None}
        if rng.random() < 0.2 and entry["name"] != "attn.mask":
            body["grad"] = True
        elif rng.random() < 0.3:
            body["step"] = int(rng.integers(1, 4))
        return "snapshot", "/api/snapshot", body, 200
    if r < 0.75:                                                         # step: next token
        body = {"prompt": prompt, "step": int(rng.integers(0, 4)), "temperature": float(rng.uniform(0, 2)),
                "top_k": int(rng.integers(1, 50)) if rng.random() < 0.5 else None}
        if rng.random() < 0.2 and body["step"] == 0:
            body["intervention"] = {"kind": "ablate", "layer": int(rng.integers(layers)),
                                    "head": int(rng.integers(heads))}
        return "next", "/api/next", body, 200
    case = ALWAYS_BAD[rng.integers(len(ALWAYS_BAD))]
    return "bad", case.run[1], case.run[2], 400


def _always_bad(c: Case) -> bool:
    """Is this inventory request bad for any model and any limits? (``layer 2`` is fine for 4 layers.)"""
    if c.ok or c.status != 400 or c.headers or not isinstance(c.run[2], (dict, bytes)):
        return False
    if c.kind in ("empty prompt", "invalid UTF-8", "parameter of the wrong type", "malformed request"):
        return True
    return any(w in " ".join(c.mention) for w in ("greater than", "less than", "finite"))   # by the schema


ALWAYS_BAD = [c for c in SERVER_CASES if _always_bad(c)]


def load_test(model_file: Path, clients: int, seconds: float, seed: int = 0, prompts: int = 12) -> dict:
    """``clients`` threads send the request mix to a server process on 127.0.0.1 for ``seconds``.

    Returns counts by kind and status, 5xx and unexpected statuses, latency
    percentiles (ms) and the server's resident memory (MB) sampled throughout.
    """
    import httpx
    import psutil

    proc = subprocess.Popen([sys.executable, "-c", SERVER_CHILD, str(model_file), str(seconds + 120)],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        if not line.strip().isdigit():
            raise AssertionError(f"the server did not start: {line!r} {proc.stderr.read()}")
        base = f"http://127.0.0.1:{int(line)}"                               # loopback only, by construction
        server = psutil.Process(proc.pid)
        with httpx.Client(base_url=base, timeout=120) as c:
            info = c.get("/api/info").json()
        rng = np.random.default_rng(seed)
        pool = [" ".join(rng.choice(WORDS, size=rng.integers(3, 12))) for _ in range(prompts)]
        rss = [server.memory_info().rss]
        results: list[tuple[str, int, int, float]] = []
        odd: list[str] = []
        lock = threading.Lock()
        stop_at = time.monotonic() + seconds

        def client(i: int):
            r = np.random.default_rng([seed, i])
            local = []
            with httpx.Client(base_url=base, timeout=120) as c:
                while time.monotonic() < stop_at:
                    kind, path, body, want = _requests(r, info, pool)
                    t0 = time.perf_counter()
                    if isinstance(body, bytes):
                        resp = c.post(path, content=body, headers={"content-type": "application/json"})
                    else:
                        resp = c.post(path, json=body)
                    if resp.status_code == 400 and "end-of-text" in resp.text and want == 200:
                        want = 400                              # greedy decoding of that prompt really ended
                    local.append((kind, resp.status_code, want, time.perf_counter() - t0))
                    if resp.status_code != want and len(odd) < 5:
                        odd.append(f"{path} {body!r:.200} -> {resp.status_code} {resp.text[:200]}")
            with lock:
                results.extend(local)

        threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(clients)]
        for t in threads:
            t.start()
        while any(t.is_alive() for t in threads):
            rss.append(server.memory_info().rss)
            time.sleep(0.25)
        for t in threads:
            t.join()
        rss.append(server.memory_info().rss)
    finally:
        proc.kill()                                                          # it would stop by itself, later
        proc.wait(timeout=30)
        proc.stdout.close()
        proc.stderr.close()

    lat = np.array([r[3] for r in results]) * 1000
    by_kind: dict = {}
    for kind, status, want, _ in results:
        by_kind.setdefault(kind, {}).setdefault(str(status), 0)
        by_kind[kind][str(status)] += 1
    pct = lambda a, q: round(float(np.percentile(a, q)), 1) if len(a) else None  # noqa: E731
    return {
        "clients": clients, "seconds": seconds, "requests": len(results),
        "per_second": round(len(results) / seconds, 1),
        "by_kind": by_kind,
        "server_errors": sum(1 for r in results if r[1] >= 500),
        "unexpected": sum(1 for r in results if r[1] != r[2]),
        "unexpected_examples": odd,
        "latency_ms": {"p50": pct(lat, 50), "p95": pct(lat, 95), "p99": pct(lat, 99),
                       "max": round(float(lat.max()), 1) if len(lat) else None},
        "latency_ms_by_kind": {k: {"p50": pct(a, 50), "p95": pct(a, 95)} for k in by_kind
                               for a in [np.array([r[3] for r in results if r[0] == k]) * 1000]},
        "rss_mb": {"start": round(rss[0] / 2**20, 1), "peak": round(max(rss) / 2**20, 1),
                   "end": round(rss[-1] / 2**20, 1)},
    }


def test_load_on_loopback_gives_no_5xx_and_bounded_memory(env, tmp_path):
    pytest.importorskip("psutil")
    stats = load_test(make_model_file(tmp_path, "tiny"), clients=8, seconds=5.0)
    assert stats["requests"] > 20, stats
    assert stats["server_errors"] == 0 and stats["unexpected"] == 0, stats
    assert {"tokens", "snapshot", "next", "bad"} <= set(stats["by_kind"]), stats
    # A few caches of traced passes of a tiny model: memory stays within tens of MB of the start.
    assert stats["rss_mb"]["peak"] - stats["rss_mb"]["start"] < 200, stats


# ----------------------------------------------------------------------------
# Binding beyond this machine
# ----------------------------------------------------------------------------

class _FakeServer:
    """Stands in for uvicorn: records where it was asked to listen, opens no socket."""

    made: list = []

    def __init__(self, app, host, port):
        self.app, self.host, self.port = app, host, port
        self.thread = threading.Thread(target=lambda: None)
        _FakeServer.made.append(self)

    def start(self):
        self.thread.start()
        self.thread.join()
        return self

    @property
    def url(self):
        return f"http://{self.host}:{self.port}/"

    def stop(self):
        pass


@pytest.mark.parametrize("host, remote", [("0.0.0.0", True), ("::", True), ("192.168.1.20", True),
                                           ("example.com", True), ("127.0.0.1", False), ("::1", False),
                                           ("localhost", False), ("127.0.0.2", False)])
def test_a_non_loopback_address_needs_a_token(env, monkeypatch, capsys, host, remote):
    """Off loopback, the server makes a token and prints it in the URL; on loopback it is open as before."""
    from fastapi.testclient import TestClient

    from glassllm.cli import main
    from glassllm.inspector import server

    _FakeServer.made.clear()
    monkeypatch.setattr(server, "Server", _FakeServer)
    assert main(["inspect", "hi", "--model", str(env.root / "tiny.safetensors"), "--host", host, "--port", "0",
                 "--no-browser"]) == 0
    out, err = capsys.readouterr()
    made = _FakeServer.made[-1]
    assert made.host == host and "warning" not in err.lower(), err
    token = out.split("?token=")[1].split()[0] if remote else None
    assert ("?token=" in out) == remote, out
    if remote:
        assert len(token) >= 22, token                    # >= 128 bits of URL-safe base64
    own = "127.0.0.1" if host in ("0.0.0.0", "::", "127.0.0.2", "localhost") else host.strip("[]")
    with TestClient(made.app, base_url=f"http://{own if ':' not in own else '[' + own + ']'}") as c:
        assert c.get("/api/info").status_code == (401 if remote else 200)
        if remote:
            assert c.get("/api/info", headers={"Authorization": f"Bearer {token}"}).status_code == 200
    # Loopback or not, the app refuses requests that name another host (DNS rebinding).
    with TestClient(made.app, base_url="http://evil.example") as c:
        assert c.get("/api/info", headers={"Authorization": f"Bearer {token}"}).status_code == 403


@pytest.mark.parametrize("flags, words", [(["--no-token"], "WARNING: --no-token"),
                                          (["--token", "class-of-2026"], None)])
def test_no_token_off_loopback_says_loudly_what_it_means(env, monkeypatch, capsys, flags, words):
    from fastapi.testclient import TestClient

    from glassllm.cli import main
    from glassllm.inspector import server

    _FakeServer.made.clear()
    monkeypatch.setattr(server, "Server", _FakeServer)
    assert main(["inspect", "hi", "--model", str(env.root / "tiny.safetensors"), "--host", "0.0.0.0",
                 "--port", "0", "--no-browser", *flags]) == 0
    out, err = capsys.readouterr()
    with TestClient(_FakeServer.made[-1].app, base_url="http://127.0.0.1") as c:
        status = c.get("/api/info").status_code
    if words:
        assert err.startswith(words) and "Anyone" in err and "?token=" not in out and status == 200, (out, err)
    else:
        assert "?token=class-of-2026" in out and not err and status == 401, (out, err)


def test_an_address_that_cannot_be_listened_on_is_one_line_before_uvicorn_starts(env, capsys):
    """A port in use, an empty or unresolvable host: exit 2 and one line, not uvicorn's own ERROR lines."""
    import socket

    from glassllm.cli import main

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        port = taken.getsockname()[1]
        for host, words in [("127.0.0.1", f"cannot listen on 127.0.0.1:{port}: Address already in use"),
                            ("", "the host is empty"), ("  ", "the host is empty")]:
            code = main(["inspect", "hi", "--model", str(env.root / "tiny.safetensors"), "--host", host,
                         "--port", str(port), "--no-browser"])
            err = capsys.readouterr().err
            assert code == 2 and err.count("\n") == 1 and words in err and "warning" not in err, err
    # Without --port, only a port in use moves to another port: a bad host is still one line.
    code = main(["inspect", "hi", "--model", str(env.root / "tiny.safetensors"), "--host", "", "--no-browser"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "the host is empty" in err, err


def test_the_default_port_taken_falls_back_to_a_free_one_and_says_so(env, monkeypatch, capsys):
    """``glassllm inspect`` without --port tries 8765, then any free port, saying so in one line on stderr."""
    import socket

    from glassllm.cli import main
    from glassllm.commands import inspect as icli
    from glassllm.inspector import server

    started = []

    class Once(server.Server):
        def start(self, timeout: float = 10.0):
            super().start(timeout)
            started.append(self.port)
            self.served_url = super().url
            self.stop()                                  # serve nothing: the CLI's loop ends at once
            return self

        @property
        def url(self):
            return self.served_url

    with socket.socket() as taken:
        taken.bind(("127.0.0.1", 0))
        taken.listen()
        monkeypatch.setattr(icli, "DEFAULT_PORT", taken.getsockname()[1])
        monkeypatch.setattr(server, "Server", Once)
        assert main(["inspect", "hi", "--model", str(env.root / "tiny.safetensors"), "--no-browser"]) == 0
        assert started and started[0] != taken.getsockname()[1]
        busy = taken.getsockname()[1]
    out, err = capsys.readouterr()
    assert f":{started[0]}/" in out and err == f"port {busy} is taken; serving on a free port instead (--port chooses one)\n", err
