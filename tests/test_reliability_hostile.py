"""Hostile files and requests: every claim bounded before it is believed (``glassllm.limits``).

Each case runs in a subprocess whose address space is capped (``RLIMIT_AS``, :data:`MEMORY`) and
whose time is bounded (:data:`SECONDS`): a reader that believed a file's sizes would die of
``MemoryError`` or time out instead of printing its one line. The cases come in four classes,
counted by ``tools/reliability_report.py`` (:data:`CLASSES`):

- **readers**: files whose header claims a huge model (layers, context, tensors, bytes);
- **parsers**: JSON documents nested 100,000 deep or of the wrong shape, anywhere glassllm reads one,
  and generated ones (Hypothesis);
- **routes**: the inspector with a model whose numbers overflow, the token exchange's redirect,
  Host headers and malformed HTTP;
- **options**: counts on the command line beyond the limits, Ctrl-C at any moment.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import struct
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from tests.test_reliability_inventory import CONFIG, INVENTORY_TOKEN, get_env, rewrite, safetensors_bytes

ROOT = Path(__file__).resolve().parents[1]
MEMORY = 1536 << 20          # bytes of address space a hostile case may use
SECONDS = 60                 # wall time a case may take (the machine may be shared; each takes about one)

# The cases of each class, by name, and the class of each test: the report counts them.
CLASSES: dict[str, list[str]] = {"readers": [], "parsers": [], "routes": [], "options": []}
CLASS_OF_TEST = {
    "test_a_file_that_claims_too_much_is_refused_at_once": "readers",
    "test_a_header_only_file_claiming_a_large_model_costs_little_memory": "readers",
    "test_a_document_of_any_shape_gives_one_line": "parsers",
    "test_generated_json_documents_parse_or_give_one_line": "parsers",
    "test_generated_safetensors_headers_load_or_give_one_line": "parsers",
    "test_generated_binary_headers_load_or_give_one_line": "readers",
    "test_the_inspector_serves_nothing_non_finite": "routes",
    "test_the_token_exchange_never_redirects_off_the_server": "routes",
    "test_a_host_header_names_one_host": "routes",
    "test_malformed_http_gets_json_errors": "routes",
    "test_generated_http_requests_get_json_answers": "routes",
    "test_counts_beyond_the_limits_are_refused": "options",
    "test_ctrl_c_at_any_moment_prints_one_line": "options",
    "test_memory_error_while_reporting_an_error_still_prints_one_line": "options",
    "test_the_doc_states_the_limits_table": "options",
}


def _register(kind: str, names) -> list:
    CLASSES[kind].extend(str(n) for n in names)
    return list(names)


def run_limited(argv: list[str], cwd: Path, memory: int = MEMORY) -> subprocess.CompletedProcess:
    """``glassllm ARGV`` in a subprocess with its address space capped at ``memory`` bytes."""
    code = textwrap.dedent(f"""
        import resource, sys
        resource.setrlimit(resource.RLIMIT_AS, ({memory}, {memory}))
        sys.argv[0] = "glassllm"
        from glassllm.cli import main
        sys.exit(main({argv!r}))
    """)
    return subprocess.run([sys.executable, "-c", code], cwd=cwd, capture_output=True, text=True, timeout=SECONDS,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"})


def one_line(proc, *words) -> str:
    """The single error line of a refused command (exit 2), which must name ``words``."""
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and "error:" in lines[0], (proc.returncode, proc.stderr[-2000:])
    for w in words:
        assert w.lower() in lines[0].lower(), (w, lines[0])
    return lines[0]


@pytest.fixture(scope="module")
def env():
    return get_env()


# ----------------------------------------------------------------------------
# Readers: sizes a file claims
# ----------------------------------------------------------------------------

def _model_file(env, **config) -> bytes:
    """The tiny model file with its config's sizes replaced (the tensors stay those of the tiny model)."""
    good = (env.root / "tiny.safetensors").read_bytes()
    return rewrite(good, edit_meta=lambda m: m.update(config=json.dumps({**CONFIG, **config})))


def _header_only(env, **config) -> bytes:
    """A model file that is a header alone (its metadata: 22 KB, mostly the tokenizer), no tensors,
    whose config claims ``config``."""
    from tests.test_reliability_inventory import parse_safetensors

    header, _ = parse_safetensors((env.root / "tiny.safetensors").read_bytes())
    meta = {**header["__metadata__"], "config": json.dumps({**CONFIG, **config})}
    return safetensors_bytes({"__metadata__": meta})


def _llama2c(L: int) -> bytes:
    return struct.pack("<7i", 64, 128, L, 4, 4, 256, 64)           # 28 bytes: dim, hidden, layers, heads, ...


def _hf_folder(root: Path, tmp_path: Path, **config) -> Path:
    """The tiny model exported as a Hugging Face folder in ``tmp_path``, its config.json's keys replaced."""
    from glassllm.hf import export_hf

    folder = tmp_path / "hf"
    export_hf(root / "tiny.safetensors", folder)
    doc = json.loads((folder / "config.json").read_text())
    doc.update(config)
    (folder / "config.json").write_text(json.dumps(doc))
    return folder


def _gguf_prefix(n_tensors: int, n_kv: int) -> bytes:
    return b"GGUF" + struct.pack("<IQQ", 3, n_tensors, n_kv) + b"\0" * 64


def _zip64_trace(env, path: Path, C: int) -> Path:
    """A 2 KB trace whose snapshot member claims 160 GB (zip64 sizes), its .npy header and manifest
    agreeing that it holds float32 (64, C)."""
    import zipfile
    import zlib

    from glassllm.trace import trace

    t = trace(env.model, [1, 2, 3], names=["embed"])
    t.save(path)
    with zipfile.ZipFile(path) as z:
        manifest = json.loads(z.read("manifest.json"))
    n = 64
    manifest["config"].update(dim=C, n_heads=256, n_kv_heads=256, max_seq_len=64)
    manifest["steps"][0].update(n=n, m=n, tokens=[1] * n, shapes={"embed": [n, C]})
    npy = b"\x93NUMPY\x01\x00"
    head = repr({"descr": "<f4", "fortran_order": False, "shape": (n, C)}).encode()
    head += b" " * (-(len(npy) + 2 + len(head) + 1) % 64) + b"\n"
    npy += struct.pack("<H", len(head)) + head + b"\0" * 64
    members = [("manifest.json", json.dumps(manifest).encode(), None), ("values/0/embed.npy", npy, 160 * 10**9)]
    out, central = b"", b""
    for name, data, claimed in members:
        nb, crc = name.encode(), zlib.crc32(data)
        sizes, extra = ((len(data), len(data)), b"") if claimed is None else \
            ((0xFFFFFFFF, 0xFFFFFFFF), struct.pack("<HHQQ", 1, 16, claimed, claimed))
        offset = len(out)
        out += struct.pack("<IHHHHHIIIHH", 0x04034B50, 45, 0, 0, 0, 0, crc, sizes[1], sizes[0], len(nb),
                           len(extra)) + nb + extra + data
        central += struct.pack("<IHHHHHHIIIHHHHHII", 0x02014B50, 45, 45, 0, 0, 0, 0, crc, sizes[1], sizes[0],
                               len(nb), len(extra), 0, 0, 0, 0, offset) + nb + extra
    path.write_bytes(out + central + struct.pack("<IHHHHIIH", 0x06054B50, 0, 0, 2, 2, len(central), len(out), 0))
    return path


READERS = _register("readers", [
    "model file header only: n_layers=10**7", "model file: max_seq_len=10**8", "model file: n_layers=10**7",
    "model file header only: 1,024 layers of width 8,192",
    "model file: tensors whose offsets overlap", "llama2.c: 28 bytes claiming 2**20 layers",
    "llama2.c: seq_len=10**8", "GGUF: 2**40 tensors in 88 bytes", "HF: num_hidden_layers=10**7",
    "HF: max_position_embeddings=10**8", "HF: tokenizer.json of 200,000 ids", "trace: a zip64 member claiming 160 GB",
    "trace: a member claiming more bytes than the archive", "train state: damaged records",
    "model file: a tied config beside an output tensor", "model file: tie_embeddings='yes'",
    "model file header only: tied, 1,024 layers of width 8,192", "HF: tied, num_hidden_layers=10**7",
])


@pytest.mark.parametrize("case", READERS)
def test_a_file_that_claims_too_much_is_refused_at_once(env, case, tmp_path):
    root = env.root
    if case == "model file header only: n_layers=10**7":
        (tmp_path / "m.safetensors").write_bytes(_header_only(env, n_layers=10**7))
        one_line(run_limited(["generate", "hi", "--model", str(tmp_path / "m.safetensors")], root), "n_layers", "limit")
    elif case == "model file: n_layers=10**7":
        (tmp_path / "m.safetensors").write_bytes(_model_file(env, n_layers=10**7))
        one_line(run_limited(["generate", "hi", "--model", str(tmp_path / "m.safetensors")], root), "n_layers", "limit")
    elif case == "model file: max_seq_len=10**8":
        (tmp_path / "m.safetensors").write_bytes(_model_file(env, max_seq_len=10**8))
        one_line(run_limited(["generate", "hi", "--model", str(tmp_path / "m.safetensors")], root), "max_seq_len")
    elif case == "model file header only: 1,024 layers of width 8,192":
        (tmp_path / "m.safetensors").write_bytes(_header_only(env, n_layers=1024, dim=8192, n_heads=64,
                                                              n_kv_heads=8, ffn_dim=28672))
        one_line(run_limited(["generate", "hi", "--model", str(tmp_path / "m.safetensors")], root), "missing tensor")
    elif case == "model file: a tied config beside an output tensor":
        (tmp_path / "m.safetensors").write_bytes(_model_file(env, tie_embeddings=True))
        one_line(run_limited(["generate", "hi", "--model", str(tmp_path / "m.safetensors")], root),
                 "unexpected tensor 'output.weight'")
    elif case == "model file: tie_embeddings='yes'":
        (tmp_path / "m.safetensors").write_bytes(_model_file(env, tie_embeddings="yes"))
        one_line(run_limited(["generate", "hi", "--model", str(tmp_path / "m.safetensors")], root),
                 "tie_embeddings must be true or false")
    elif case == "model file header only: tied, 1,024 layers of width 8,192":
        (tmp_path / "m.safetensors").write_bytes(_header_only(env, n_layers=1024, dim=8192, n_heads=64,
                                                              n_kv_heads=8, ffn_dim=28672, tie_embeddings=True))
        one_line(run_limited(["generate", "hi", "--model", str(tmp_path / "m.safetensors")], root), "missing tensor")
    elif case == "HF: tied, num_hidden_layers=10**7":
        folder = _hf_folder(root, tmp_path, num_hidden_layers=10**7, tie_word_embeddings=True)
        one_line(run_limited(["import", str(folder), str(tmp_path / "o.safetensors")], root), "n_layers", "limit")
    elif case == "model file: tensors whose offsets overlap":
        from tests.test_reliability_inventory import parse_safetensors

        header, data = parse_safetensors((root / "tiny.safetensors").read_bytes())
        longest = 0
        for name, info in header.items():                         # every tensor reads the same first bytes
            if name != "__metadata__":
                lo, hi = info["data_offsets"]
                info["data_offsets"] = [0, hi - lo]
                longest = max(longest, hi - lo)
        (tmp_path / "m.safetensors").write_bytes(safetensors_bytes(header, data[:longest]))
        one_line(run_limited(["generate", "hi", "--model", str(tmp_path / "m.safetensors")], root), "overlapping")
    elif case == "llama2.c: 28 bytes claiming 2**20 layers":
        (tmp_path / "model.bin").write_bytes(_llama2c(2**20))
        one_line(run_limited(["import", str(tmp_path / "model.bin"), str(tmp_path / "o.safetensors")], root),
                 "n_layers", "limit")
    elif case == "llama2.c: seq_len=10**8":
        (tmp_path / "model.bin").write_bytes(struct.pack("<7i", 64, 128, 2, 4, 4, 256, 10**8))
        one_line(run_limited(["import", str(tmp_path / "model.bin"), str(tmp_path / "o.safetensors")], root),
                 "seq_len=100000000")
    elif case == "GGUF: 2**40 tensors in 88 bytes":
        (tmp_path / "m.gguf").write_bytes(_gguf_prefix(2**40, 3))
        one_line(run_limited(["import", str(tmp_path / "m.gguf"), str(tmp_path / "o.safetensors")], root),
                 "tensor_count", "limit")
    elif case == "HF: num_hidden_layers=10**7":
        folder = _hf_folder(root, tmp_path, num_hidden_layers=10**7)
        one_line(run_limited(["import", str(folder), str(tmp_path / "o.safetensors")], root), "n_layers", "limit")
    elif case == "HF: max_position_embeddings=10**8":
        folder = _hf_folder(root, tmp_path, max_position_embeddings=10**8)
        one_line(run_limited(["import", str(folder), str(tmp_path / "o.safetensors")], root), "max_seq_len")
    elif case == "HF: tokenizer.json of 200,000 ids":
        folder = _hf_folder(root, tmp_path)
        doc = json.loads((folder / "tokenizer.json").read_text())
        doc["model"]["vocab"] = {f"t{i}": i for i in range(200_000)}
        (folder / "tokenizer.json").write_text(json.dumps(doc))
        one_line(run_limited(["import", str(folder), str(tmp_path / "o.safetensors")], root), "model.vocab", "limit")
    elif case.startswith("trace:"):
        path = _zip64_trace(env, tmp_path / "t.npz", 1 << 29 if "160 GB" in case else 1 << 16)
        code = (f"import resource; resource.setrlimit(resource.RLIMIT_AS, ({MEMORY}, {MEMORY}))\n"
                f"from glassllm.trace import load_trace\n"
                f"try:\n    load_trace({str(path)!r})\nexcept ValueError as e:\n    print(e)\n")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SECONDS)
        assert proc.returncode == 0 and not proc.stderr and len(proc.stdout.strip().splitlines()) == 1, proc
        assert "t.npz" in proc.stdout and ("limit" in proc.stdout or "whole file has" in proc.stdout), proc.stdout
    elif case == "train state: damaged records":
        from glassllm.train.folder import write_state

        for meta in ({"train_config": "[1]"}, {"train_config": "{}", "model_config": "[" * 100_000},
                     {"train_config": "{}", "model_config": json.dumps(CONFIG), "data": "[]"}):
            run = tmp_path / f"run{len(meta)}"
            run.mkdir()
            write_state(run / "train_state.safetensors", {}, meta)
            one_line(run_limited(["train", "--resume", "--out", str(run)], root), "cannot resume")


def test_a_header_only_file_claiming_a_large_model_costs_little_memory(env, tmp_path):
    """Peak memory while refusing a 22 KB header whose config claims 10**7 layers, or 1,024 layers of
    width 8,192 (a 400 GB model): below 8 x the file's size + 16 MB above what importing glassllm takes."""
    _peak_for(_header_only(env, n_layers=10**7), tmp_path)
    _peak_for(_header_only(env, n_layers=1024, dim=8192, n_heads=64, n_kv_heads=8, ffn_dim=28672), tmp_path)
    _peak_for(_header_only(env, n_layers=1024, dim=8192, n_heads=64, n_kv_heads=8, ffn_dim=28672,
                           tie_embeddings=True), tmp_path)


def _peak_for(blob: bytes, tmp_path: Path) -> None:
    (tmp_path / "m.safetensors").write_bytes(blob)
    code = textwrap.dedent(f"""
        import resource
        import glassllm.checkpoint, glassllm.nn, glassllm.tokenizing, safetensors
        base = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
        try:
            glassllm.checkpoint.load_model({str(tmp_path / "m.safetensors")!r})
        except ValueError as e:
            print(str(e)[:200])
        print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - base)
    """)
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=SECONDS,
                          preexec_fn=lambda: __import__("resource").setrlimit(
                              __import__("resource").RLIMIT_AS, (MEMORY, MEMORY)))
    line, grown = proc.stdout.strip().splitlines()
    assert "m.safetensors" in line, proc
    assert int(grown) < 8 * len(blob) + (16 << 20), (int(grown), len(blob))


# ----------------------------------------------------------------------------
# Parsers: documents of any nesting and shape
# ----------------------------------------------------------------------------

DEEP = b"[" * 100_000
PARSERS = _register("parsers", [
    "config.json nested 100,000 deep", "tokenizer.json nested 100,000 deep", "tokenizer_config.json nested",
    "index nested 100,000 deep", "safetensors header nested 100,000 deep", "weight_map a list",
    "tokenizer_config.json is [1]", "header entry without shape", "generated JSON documents (parse_json)",
])


def _hf_with(tmp_path: Path, env, files: dict[str, bytes], drop=()) -> Path:
    from glassllm.hf import export_hf

    folder = tmp_path / "hf"
    export_hf(env.root / "tiny.safetensors", folder)
    for name in drop:
        (folder / name).unlink()
    for name, blob in files.items():
        (folder / name).write_bytes(blob)
    return folder


@pytest.mark.parametrize("case", PARSERS[:-1])
def test_a_document_of_any_shape_gives_one_line(env, case, tmp_path):
    from glassllm.files import read_safetensors

    good = (env.root / "tiny.safetensors").read_bytes()
    if case == "safetensors header nested 100,000 deep":
        (tmp_path / "m.safetensors").write_bytes(struct.pack("<Q", len(DEEP)) + DEEP)
        with pytest.raises(ValueError, match="not valid JSON"):
            read_safetensors(tmp_path / "m.safetensors")
        return
    if case == "header entry without shape":
        def drop_shape(h):
            del h["norm.weight"]["shape"]
        (tmp_path / "m.safetensors").write_bytes(rewrite(good, edit_header=drop_shape))
        with pytest.raises(ValueError, match="malformed header entry"):
            read_safetensors(tmp_path / "m.safetensors")
        one_line(run_limited(["generate", "hi", "--model", str(tmp_path / "m.safetensors")], env.root), "norm.weight")
        return
    index = json.dumps({"weight_map": {}}).encode()
    files, drop, words = {
        "config.json nested 100,000 deep": ({"config.json": DEEP}, (), ("config.json", "nested")),
        "tokenizer.json nested 100,000 deep": ({"tokenizer.json": DEEP}, (), ("tokenizer.json", "nested")),
        "tokenizer_config.json nested": ({"tokenizer.model": b"", "tokenizer_config.json": DEEP}, ("tokenizer.json",),
                                         ("tokenizer_config.json", "nested")),
        "index nested 100,000 deep": ({"model.safetensors.index.json": DEEP}, ("model.safetensors",), ("index", "nested")),
        "weight_map a list": ({"model.safetensors.index.json": b'{"weight_map": [1, 2]}'}, ("model.safetensors",),
                              ("weight_map", "list")),
        "tokenizer_config.json is [1]": ({"tokenizer.model": b"", "tokenizer_config.json": b"[1]"},
                                         ("tokenizer.json",), ("tokenizer_config.json", "object")),
    }[case]
    del index
    folder = _hf_with(tmp_path, env, files, drop)
    one_line(run_limited(["import", str(folder), str(tmp_path / "o.safetensors")], env.root), *words)


def _json_values():
    from hypothesis import strategies as st

    scalars = st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=8)
    return st.recursive(scalars, lambda kids: st.lists(kids, max_size=4) | st.dictionaries(st.text(max_size=4), kids,
                                                                                          max_size=4), max_leaves=30)


def test_generated_json_documents_parse_or_give_one_line():
    """Any JSON text, any nesting (up to 200,000 brackets), any bytes: the value, or one ValueError line."""
    from hypothesis import given, settings
    from hypothesis import strategies as st

    from glassllm.limits import MAX_JSON_DEPTH, json_depth, parse_json

    @settings(max_examples=JSON_EXAMPLES, deadline=None, database=None, derandomize=True)
    @given(doc=_json_values(), depth=st.integers(0, 200_000), opener=st.sampled_from(["[", '{"a":']),
           junk=st.binary(max_size=40))
    def check(doc, depth, opener, junk):
        text = json.dumps(doc)
        assert parse_json(text, "doc") == json.loads(text) or json_depth(text.encode()) > MAX_JSON_DEPTH or doc != doc
        for raw in ((opener * depth).encode() + text.encode(), junk, text.encode() + junk):
            try:
                parse_json(raw, "doc")
            except ValueError as e:
                assert "\n" not in str(e) and str(e).startswith("doc ")

    check()


# ----------------------------------------------------------------------------
# Routes: the inspector's server
# ----------------------------------------------------------------------------

ROUTES_NON_FINITE = [("/api/snapshot", {"prompt": "hi", "name": "attn.scores", "layer": 1, "head": 0}),
                     ("/api/heads", {"prompt": "hi"}), ("/api/next", {"prompt": "hi"}),
                     ("/api/next", {"prompt": "hi", "step": 1}), ("/api/lens", {"prompt": "hi"}),
                     ("/api/attribution", {"prompt": "hi"}),
                     ("/api/snapshot", {"prompt": "hi", "name": "resid_pre", "layer": 0, "grad": True})]
_register("routes", [f"overflowing model: POST {p} {b}" for p, b in ROUTES_NON_FINITE])
_register("routes", ["overflowing model: inspect --html", "redirect //evil.example/", "redirect /%2F%2Fevil.example",
                     "redirect /\\evil.example", "Host: 127.0.0.1:P, evil.example", "two Host headers",
                     "garbage request line", "bad Content-Length"])


def test_the_inspector_serves_nothing_non_finite(env, tmp_path):
    """The model whose layer-1 wq and wk are scaled by 1e21: every route that runs it answers 400 with
    the line generate gives; --html exits 2 and writes nothing."""
    from fastapi.testclient import TestClient

    from glassllm.checkpoint import load_model
    from glassllm.inspector import Inspector, create_app
    from glassllm.inspector.auth import Access, own_hosts

    model, tok, _ = load_model(env.root / "overflow.safetensors")
    client = TestClient(create_app(Inspector(model, tok), prompt="hi", access=Access(None, own_hosts("127.0.0.1"))),
                        base_url="http://127.0.0.1", raise_server_exceptions=False)
    for path, body in ROUTES_NON_FINITE:
        r = client.post(path, json=body)
        assert r.status_code == 400 and r.json() == {"error": "logits contain NaN or +inf: the model's output is "
                                                              "broken"}, (path, r.status_code, r.text[:200])
    proc = run_limited(["inspect", "hi", "--model", "overflow.safetensors", "--html", str(tmp_path / "p.html")],
                       env.root)
    one_line(proc, "logits", "NaN")
    assert not (tmp_path / "p.html").exists()


@pytest.fixture(scope="module")
def server(env):
    """A real server (uvicorn and the guarded protocol) on 127.0.0.1 that requires INVENTORY_TOKEN."""
    from glassllm.inspector import Inspector, create_app
    from glassllm.inspector.auth import Access, own_hosts
    from glassllm.inspector.server import Server

    app = create_app(Inspector(env.model, env.tok), prompt="hi", access=Access(INVENTORY_TOKEN, own_hosts("127.0.0.1")))
    srv = Server(app, "127.0.0.1", 0).start()
    yield srv
    srv.stop()


def _exchange(server, raw: bytes) -> tuple[bytes, bytes]:
    """Send ``raw`` bytes as they are; the answer's head and body."""
    with socket.create_connection(("127.0.0.1", server.port), timeout=10) as s:
        s.sendall(raw)
        answer = b""
        while chunk := s.recv(65536):
            answer += chunk
            if b"\r\n\r\n" in answer and b"connection: close" not in answer.lower() and answer.startswith(b"HTTP/1.1 303"):
                break
    head, _, body = answer.partition(b"\r\n\r\n")
    return head, body


def test_the_token_exchange_never_redirects_off_the_server(server):
    from glassllm.inspector.auth import same_origin_path

    for target, where in [(b"//evil.example/", b"/evil.example/"), (b"/%2F%2Fevil.example", b"/"),
                          (b"/%2f/evil.example", b"/"), (b"/\\evil.example", b"/evil.example"),
                          (b"/%5Cevil.example", b"/"), (b"///evil.example", b"/evil.example"), (b"/", b"/")]:
        head, _ = _exchange(server, b"GET " + target + b"?token=" + INVENTORY_TOKEN.encode() +
                            b" HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n")
        assert head.startswith(b"HTTP/1.1 303"), (target, head[:200])
        location = next(line.split(b":", 1)[1].strip() for line in head.split(b"\r\n")
                        if line.lower().startswith(b"location:"))
        assert location == where, (target, location)
    assert same_origin_path("/a//b") == "/a//b" and same_origin_path("/\x00evil") == "/"


def test_a_host_header_names_one_host(env):
    client = env.client()
    for host in ("127.0.0.1:8000, evil.example", "127.0.0.1 evil.example", "127.0.0.1:8000/x"):
        r = client.get("/api/info", headers={"host": host})
        assert r.status_code == 403 and "error" in r.json(), (host, r.status_code)
    assert client.get("/api/info", headers={"host": "127.0.0.1:8000"}).status_code == 200


def test_malformed_http_gets_json_errors(server):
    for raw in (b"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1\r\nHost: 127.0.0.1\r\n\r\n",
                b"GARBAGE\r\n\r\n",
                b"POST /api/tokens HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: -5\r\n\r\n",
                b"POST /api/tokens HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 5\r\nContent-Length: 7\r\n\r\n"):
        head, body = _exchange(server, raw)
        assert head.startswith(b"HTTP/1.1 400"), (raw, head[:300])
        assert b"application/json" in head.lower() and "error" in json.loads(body), (raw, head[:300], body[:200])


# ----------------------------------------------------------------------------
# Options and signals
# ----------------------------------------------------------------------------

OPTIONS = _register("options", [
    ["train", "--data", "train.txt", "--out", "r", "--steps", "2", "--timeline-points", "100000000"],
    ["eval", "--model", "tiny.safetensors", "--data", "train.txt", "--threads", "100000"],
    ["train", "--data", "train.txt", "--out", "r", "--steps", "2", "--threads", "100000"],
    ["train", "--data", "train.txt", "--out", "r", "--steps", "2", "--workers", "100000"],
    ["inspect", "hi", "--model", "tiny.safetensors", "--workers", "100000"],
])


@pytest.mark.parametrize("argv", OPTIONS, ids=" ".join)
def test_counts_beyond_the_limits_are_refused(env, argv):
    one_line(run_limited(argv, env.root), "limit")


_register("options", ["Ctrl-C at 10 moments, from the first import on", "MemoryError while reporting an error"])


def test_ctrl_c_at_any_moment_prints_one_line(env, tmp_path):
    """SIGINT at 10 moments from the start of ``main`` (which imports NumPy, the commands and the model)
    on: always one line, exit 130. (glassllm.cli's own first lines install the same handler for the
    moment before; while Python itself starts, Ctrl-C is Python's own.)"""
    script = tmp_path / "glassllm"
    script.write_text("import os, sys\nfrom glassllm.cli import main\nos.write(1, b'r')\nsys.exit(main())\n")
    for delay in (0, 0.002, 0.005, 0.01, 0.02, 0.05, 0.1, 0.2, 0.4, 0.8):
        p = subprocess.Popen([sys.executable, str(script), "inspect", "once upon a time", "--model",
                              "tiny.safetensors", "--html", str(tmp_path / "page.html")], cwd=env.root,
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        assert p.stdout.read(1) == b"r"
        time.sleep(delay)
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=SECONDS)
        lines = err.decode().strip().splitlines()
        if p.returncode == 0:            # it finished first
            continue
        assert p.returncode == 130 and len(lines) == 1 and lines[0].endswith("interrupted"), (delay, err[-600:])


def test_memory_error_while_reporting_an_error_still_prints_one_line(capfd, monkeypatch):
    """A command fails (a missing tokenizer file), and formatting its error line runs out of memory: the
    last-resort handler still prints one line."""
    import glassllm.cli as cli

    def out_of_memory(e):
        raise MemoryError
    monkeypatch.setattr(cli, "_one_line", out_of_memory)
    code = cli.main(["tokenize", "hi", "--tokenizer", "missing-file.json"])
    err = capfd.readouterr().err.strip().splitlines()
    assert (code, err) == (2, ["glassllm tokenize: error: not enough memory"])


# ----------------------------------------------------------------------------
# Generated hostile inputs (Hypothesis), each property in a subprocess under the memory limit
# ----------------------------------------------------------------------------

EXAMPLES = int(os.environ.get("GLASSLLM_HOSTILE_EXAMPLES", "40"))
JSON_EXAMPLES = 150
# Generated examples per class (each property's examples, plus its explicit @example cases).
GENERATED = {"readers": EXAMPLES + 1, "parsers": EXAMPLES + 2 + JSON_EXAMPLES, "routes": EXAMPLES, "options": 0}


def run_property(body: str, *args: str) -> None:
    """Run the Hypothesis property ``body`` (Python source defining ``check()``) in a subprocess with
    the address space capped; it must finish in time and print ``ok``."""
    code = (f"import resource\nresource.setrlimit(resource.RLIMIT_AS, ({MEMORY}, {MEMORY}))\n"
            f"EXAMPLES = {EXAMPLES}\n" + textwrap.dedent(body) + "\ncheck()\nprint('ok')\n")
    proc = subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=SECONDS * 3,
                          env={**os.environ, "PYTHONDONTWRITEBYTECODE": "1"}, cwd=ROOT)
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]


_ONE_LINE = '''
def one_line(fn):
    try:
        fn()
    except ValueError as e:
        assert "\\n" not in str(e) and str(e), repr(e)
'''


def test_generated_safetensors_headers_load_or_give_one_line(tmp_path):
    """Headers of any shape (sizes up to 2**63, wrong types, missing fields, overlapping offsets) over
    up to 256 bytes of data: read_safetensors, read_header and load_model load them or give one line."""
    run_property(_ONE_LINE + '''
import json, struct, sys, tempfile
from pathlib import Path
from hypothesis import example, given, settings, strategies as st
from glassllm.checkpoint import load_model, read_header
from glassllm.files import read_safetensors
from glassllm.tokenizer import Tokenizer

TOKENIZER = Tokenizer.train([" ".join(f"w{i} x{i * 7}" for i in range(400))], vocab_size=300).to_json()

big = st.integers(-2, 2**63) | st.sampled_from([0, 1, 4, 2**31, 2**40])
odd = st.none() | st.booleans() | st.text(max_size=3) | st.floats()
entry = st.fixed_dictionaries({}, optional={"dtype": st.sampled_from(["F32", "F64", "F16", "BF16", "I8", ""]) | odd,
                                            "shape": st.lists(big | odd, max_size=10) | odd,
                                            "data_offsets": st.lists(big | odd, max_size=3) | odd})
TINY = {"vocab_size": 300, "dim": 32, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 64, "max_seq_len": 64}
# A valid config with one size replaced: by a huge value, a wrong type, anything.
config = st.tuples(st.sampled_from(sorted(TINY)), big | odd | st.sampled_from([10**7, 10**8, 2**20])).map(
    lambda kv: {**TINY, kv[0]: kv[1]})
folder = Path(sys.argv[1])

@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True)
@given(entries=st.dictionaries(st.sampled_from(["tok_embeddings.weight", "norm.weight", "output.weight", "x"]),
                               entry | odd, max_size=4),
       cfg=config, data=st.binary(max_size=256))
@example(entries={}, cfg={**TINY, "n_layers": 10**7}, data=b"")             # the issue's 22 KB header
@example(entries={}, cfg={**TINY, "max_seq_len": 10**8}, data=b"")
def check(entries, cfg, data):
    meta = {"format": "glassllm-model", "version": "1", "config": json.dumps(cfg), "tokenizer": TOKENIZER}
    raw = json.dumps({"__metadata__": meta, **entries}).encode()
    path = folder / "m.safetensors"
    path.write_bytes(struct.pack("<Q", len(raw)) + raw + data)
    for fn in (read_safetensors, read_header, load_model):
        one_line(lambda: fn(path))
''', str(tmp_path))


def test_generated_binary_headers_load_or_give_one_line(tmp_path):
    """llama2.c headers of any 7 int32 (and the version 1 magic) and GGUF openings of any counts, over
    up to 512 bytes: refused in one line, never a large allocation."""
    run_property(_ONE_LINE + '''
import struct, sys
from pathlib import Path
from hypothesis import example, given, settings, strategies as st
from glassllm.fromgguf import read_gguf
from glassllm.fromllama2c import read_llama2c

folder = Path(sys.argv[1])
i32 = st.integers(-2**31, 2**31 - 1) | st.sampled_from([1, 2, 4, 64, 2**20, 10**8])
VALID = [64, 128, 2, 4, 4, 256, 64]          # dim, hidden_dim, n_layers, n_heads, n_kv_heads, vocab_size, seq_len
ints = st.one_of(st.lists(i32, min_size=7, max_size=7),
                 st.tuples(st.integers(0, 6), i32).map(lambda kv: VALID[:kv[0]] + [kv[1]] + VALID[kv[0] + 1:]))

@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True)
@given(ints=ints, v1=st.booleans(), counts=st.tuples(
           st.integers(0, 2**64 - 1), st.integers(0, 2**64 - 1)), version=st.sampled_from([1, 2, 3, 2**31]),
       tail=st.binary(max_size=512))
@example(ints=[64, 128, 2**20, 4, 4, 256, 64], v1=False, counts=(0, 0), version=3, tail=b"")   # 28 bytes, 2**20 layers
def check(ints, v1, counts, version, tail):
    head = (struct.pack("<Ii", 0x616B3432, 1) + struct.pack("<7i", *ints) + b"\\0" * 220) if v1 else struct.pack("<7i", *ints)
    (folder / "model.bin").write_bytes(head + tail)
    one_line(lambda: read_llama2c(folder / "model.bin"))
    (folder / "m.gguf").write_bytes(b"GGUF" + struct.pack("<IQQ", version, *counts) + tail)
    one_line(lambda: read_gguf(folder / "m.gguf"))
''', str(tmp_path))


def test_generated_http_requests_get_json_answers():
    """Raw requests of any request line, Host, Content-Length and body, sent to a real server: never a
    5xx, and every 4xx is JSON ``{"error": ...}`` (or, for bytes h11 cannot parse at all, the same)."""
    run_property('''
import json, socket
from hypothesis import given, settings, strategies as st
from glassllm.config import ModelConfig
from glassllm.inspector import Inspector, create_app
from glassllm.inspector.server import Server
from glassllm.nn import Transformer
from glassllm.tokenizer import Tokenizer

tok = Tokenizer.train(["once upon a time there was a cat"] * 20, vocab_size=260)
model = Transformer(ModelConfig(vocab_size=260, dim=16, n_layers=1, n_heads=2, n_kv_heads=1, ffn_dim=32,
                                max_seq_len=32), seed=0)
server = Server(create_app(Inspector(model, tok), prompt="hi"), "127.0.0.1", 0).start()
token = st.text(st.characters(min_codepoint=33, max_codepoint=126), min_size=1, max_size=12)
hosts = st.sampled_from(["127.0.0.1", "127.0.0.1:1, evil.example", "evil.example", "", "[::1]", "127.0.0.1 x"])

@settings(max_examples=EXAMPLES, deadline=None, database=None, derandomize=True)
@given(method=st.sampled_from(["GET", "POST", "PUT", "G\\x00T", ""]) | token,
       path=st.sampled_from(["/", "/api/info", "/api/tokens", "/api/next", "//evil.example/", "/%2F%2F"]) | token,
       host=st.lists(hosts, max_size=2), length=st.none() | st.sampled_from(["-1", "abc", "5", "99999999999", "0"]),
       body=st.binary(max_size=64))
def check(method, path, host, length, body):
    lines = [f"{method} {path} HTTP/1.1"] + [f"Host: {h}" for h in host]
    if length is not None:
        lines.append(f"Content-Length: {length}")
    lines += ["Content-Type: application/json", "Connection: close"]
    raw = ("\\r\\n".join(lines) + "\\r\\n\\r\\n").encode("latin-1") + body
    with socket.create_connection(("127.0.0.1", server.port), timeout=15) as s:
        s.sendall(raw)
        s.shutdown(socket.SHUT_WR)
        answer = b""
        try:
            while chunk := s.recv(65536):
                answer += chunk
        except (ConnectionResetError, TimeoutError):
            pass
    if not answer:
        return
    head, _, rest = answer.partition(b"\\r\\n\\r\\n")
    status = int(head.split(b" ", 2)[1])
    assert status < 500, (raw, head)
    if status >= 400:
        assert b"application/json" in head.lower() and "error" in json.loads(rest), (raw, answer[:300])
''')


def test_the_doc_states_the_limits_table():
    from glassllm.limits import markdown_table

    text = (ROOT / "docs" / "reliability.md").read_text(encoding="utf-8")
    begin = "<!-- BEGIN LIMITS: glassllm.limits.markdown_table() -->\n"
    assert begin in text, "docs/reliability.md lacks the limits table (python -m tools.reliability_report --hostile)"
    assert text.split(begin, 1)[1].split("<!-- END LIMITS -->", 1)[0] == markdown_table(), \
        "docs/reliability.md's limits table is stale: python -m tools.reliability_report --hostile"


def test_a_timeline_whose_metadata_nests_too_deep_is_one_line(tmp_path):
    """A timeline file's JSON fields are bounded like every other reader's: a field nested thousands
    deep is a ValueError naming it, not a RecursionError from json."""
    from glassllm.checkpoint import bundled_model_path
    from glassllm.files import read_safetensors, read_safetensors_metadata, write_safetensors
    from glassllm.timeline import load_timeline, timeline_path_for

    source = timeline_path_for(bundled_model_path())
    meta = read_safetensors_metadata(source)
    meta["ids"] = "[" * 100_000 + "]" * 100_000
    bad = tmp_path / "bad.timeline.safetensors"
    write_safetensors(bad, read_safetensors(source), meta)
    with pytest.raises(ValueError, match="'ids'") as e:
        load_timeline(bad)
    assert "\n" not in str(e.value) and "nested" in str(e.value)
