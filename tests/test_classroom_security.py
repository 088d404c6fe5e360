"""The inspector served to a class: each protection, tried by a request that it must stop.

Every test here fails when its protection is removed: the access token on every
route (missing, wrong, in each place it may travel), the first visit's cookie,
cross-site requests carrying a valid token, a foreign ``Host`` (DNS rebinding),
path traversal on the static files, an oversized body, a slow body, many idle
connections, and the trace cache returning another prompt's numbers.

The model is the reliability inventory's tiny one (300 ids, 64 positions).
"""

from __future__ import annotations

import base64
import json

import pytest

pytest.importorskip("fastapi")
pytest.importorskip("httpx")

from fastapi.testclient import TestClient  # noqa: E402

from tests.test_reliability_inventory import get_env  # noqa: E402

TOKEN = "test-token-of-the-class-0123456789"
BASE = "http://127.0.0.1"


@pytest.fixture(scope="module")
def env():
    return get_env()


@pytest.fixture(scope="module")
def inspector(env):
    from glassllm.inspector import Inspector, Limits

    return Inspector(env.model, env.tok, Limits(max_prompt_tokens=32, max_new_tokens=4, max_cells=1 << 16))


def make_app(inspector, token=TOKEN, **kw):
    from glassllm.inspector.auth import Access, own_hosts
    from glassllm.inspector.server import create_app

    return create_app(inspector, prompt="once upon a time", access=Access(token, own_hosts("127.0.0.1")), **kw)


@pytest.fixture(scope="module")
def app(inspector):
    return make_app(inspector)


@pytest.fixture()
def client(app):
    with TestClient(app, base_url=BASE, follow_redirects=False) as c:
        yield c


def routes(app) -> list[tuple[str, str]]:
    """Every (method, path) the app serves, read from the app itself (so a new route is covered too)."""
    out = []
    for r in app.routes:
        for method in sorted(getattr(r, "methods", None) or ()):
            if method != "HEAD":
                out.append((method, r.path))
    assert ("GET", "/") in out and ("POST", "/api/snapshot") in out, out
    return out


BODIES = {"/api/tokens": {"prompt": "once upon a time"},
          "/api/next": {"prompt": "once upon a time"},
          "/api/snapshot": {"prompt": "once upon a time", "name": "attn.softmax", "layer": 0, "head": 0}}


def call(client, method, path, headers=None, cookies=None, params=None):
    body = BODIES.get(path, {"prompt": "once upon a time"}) if method == "POST" else None
    client.cookies.clear()
    for k, v in (cookies or {}).items():
        client.cookies.set(k, v)
    return client.request(method, path, json=body, headers=headers or {}, params=params)


def assert_refused(r, path, label=""):
    assert r.status_code == 401, (path, label, r.status_code, r.text[:200])
    if path.startswith("/api/"):
        assert r.json() == {"error": "this inspector needs its access token"}, r.text
    else:
        assert r.headers["content-type"].startswith("text/html") and "access token" in r.text, r.text[:200]
        assert TOKEN not in r.text


# ----------------------------------------------------------------------------
# The token
# ----------------------------------------------------------------------------

def test_every_route_refuses_a_request_without_the_token_or_with_a_wrong_one(client, app):
    from glassllm.inspector.auth import Access

    name = Access(TOKEN, frozenset()).cookie_name
    wrong = TOKEN[:-1] + ("x" if TOKEN[-1] != "x" else "y")
    for method, path in routes(app):
        assert_refused(call(client, method, path), path)
        for attempt in [dict(headers={"Authorization": f"Bearer {wrong}"}),
                        dict(headers={"Authorization": f"token {wrong}"}),
                        dict(headers={"Authorization": TOKEN}),                  # no scheme: not a token
                        dict(cookies={name: wrong}), dict(cookies={name: TOKEN}),   # the cookie holds a digest
                        dict(cookies={"glassllm-open": "1"}),
                        dict(params={"token": wrong}), dict(params={"token": ""}),
                        dict(params={"token": TOKEN.upper()})]:
            assert_refused(call(client, method, path, **attempt), path, f"{method} {attempt}")
        # ... and lets the right one through (whatever the route then answers).
        r = call(client, method, path, headers={"Authorization": f"Bearer {TOKEN}"})
        assert r.status_code != 401, (path, r.text[:200])


def test_a_wrong_token_and_no_token_get_the_same_answer(client):
    for path in ("/", "/api/info"):
        missing = call(client, "GET", path)
        wrong = call(client, "GET", path, headers={"Authorization": "Bearer nope-nope-nope"})
        assert (missing.status_code, missing.content) == (wrong.status_code, wrong.content)


def test_the_first_visit_gets_an_httponly_samesite_strict_cookie_and_a_clean_address(client):
    r = call(client, "GET", "/", params={"token": TOKEN, "view": "1"})
    assert r.status_code == 303 and r.headers["location"] == "/?view=1", r.headers
    cookie = r.headers["set-cookie"]
    parts = [p.strip().lower() for p in cookie.split(";")]
    assert "httponly" in parts and "samesite=strict" in parts and "path=/" in parts, cookie
    assert TOKEN not in cookie                                   # the cookie holds a digest, not the token
    name, value = cookie.split(";")[0].split("=", 1)
    for path in ("/", "/js/main.js", "/api/info"):
        assert call(client, "GET", path, cookies={name: value}).status_code == 200, path
    r = call(client, "POST", "/api/tokens", cookies={name: value})
    assert r.status_code == 200 and r.json()["ids"]


def test_the_api_takes_the_token_in_a_header(client):
    for scheme in ("Bearer", "token", "bearer"):
        assert call(client, "GET", "/api/info", headers={"Authorization": f"{scheme} {TOKEN}"}).status_code == 200


def test_tokens_are_compared_in_constant_time(monkeypatch):
    """Every comparison goes through hmac.compare_digest (a plain == returns at the first differing byte)."""
    import hmac as real

    from glassllm.inspector import auth

    seen = []

    class Spy:
        @staticmethod
        def compare_digest(a, b):
            seen.append((a, b))
            return real.compare_digest(a, b)

        new = staticmethod(real.new)

    monkeypatch.setattr(auth, "hmac", Spy)
    a = auth.Access(TOKEN, frozenset())
    assert a.token_ok(TOKEN) and not a.token_ok(TOKEN + "x") and not a.cookie_ok("00")
    assert [b for _, b in seen] == [TOKEN.encode(), TOKEN.encode(), a.cookie_value.encode()]


def test_a_generated_token_has_at_least_128_random_bits():
    from glassllm.inspector.auth import new_token

    tokens = {new_token() for _ in range(200)}
    assert len(tokens) == 200
    for t in list(tokens)[:20]:
        raw = base64.urlsafe_b64decode(t + "=" * (-len(t) % 4))
        assert len(raw) * 8 >= 128, t


@pytest.mark.parametrize("bad", ["short", "has space in it", "slash/slash/slash", "x" * 257, "caf\u00e9-token"])
def test_a_token_that_cannot_travel_in_a_url_is_refused_by_the_cli(env, capsys, bad):
    from glassllm.cli import main

    assert main(["inspect", "hi", "--model", str(env.root / "tiny.safetensors"), "--token", bad]) == 2
    err = capsys.readouterr().err
    assert "--token must be 8 to 256 characters" in err and err.count("\n") == 1, err


def test_loopback_without_a_token_stays_open(inspector):
    from glassllm.inspector.server import create_app

    with TestClient(create_app(inspector), base_url=BASE) as c:
        assert c.get("/api/info").status_code == 200 and c.get("/").status_code == 200


# ----------------------------------------------------------------------------
# Cross-site requests and foreign hosts
# ----------------------------------------------------------------------------

AUTH = {"Authorization": f"Bearer {TOKEN}"}


def test_a_valid_token_in_a_cross_site_request_is_refused(client, app):
    for method, path in routes(app):
        for headers in [{"Origin": "http://evil.example"}, {"Origin": "null"},
                        {"Origin": "http://127.0.0.1:9999"},                  # another port: another origin
                        {"Origin": "http://127.0.0.1.evil.example"}]:
            r = call(client, method, path, headers={**AUTH, **headers})
            assert r.status_code == 403 and "cross-site" in r.json()["error"], (method, path, headers, r.text)
        if path.startswith("/api/"):
            for site in ("cross-site", "same-site"):
                r = call(client, method, path, headers={**AUTH, "Sec-Fetch-Site": site})
                assert r.status_code == 403, (path, site)
    # The page's own requests pass: same origin, or a typed address.
    assert call(client, "POST", "/api/tokens", headers={**AUTH, "Origin": BASE,
                                                         "Sec-Fetch-Site": "same-origin"}).status_code == 200
    # A link to the page from elsewhere (a class web page) is a cross-site navigation, and allowed.
    r = call(client, "GET", "/", params={"token": TOKEN}, headers={"Sec-Fetch-Site": "cross-site",
                                                                  "Sec-Fetch-Mode": "navigate"})
    assert r.status_code == 303


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8765", "127.0.0.1.nip.io", "[::2]:80", "",
                                  "localhost.evil.example"])
def test_a_foreign_host_header_is_refused_even_with_the_token(client, app, host):
    for method, path in routes(app):
        r = call(client, method, path, headers={**AUTH, "Host": host})
        assert r.status_code == 403 and "not this server's name" in r.json()["error"], (method, path, host)
    assert call(client, "GET", "/api/info", headers={**AUTH, "Host": "localhost:8765"}).status_code == 200


def test_the_open_loopback_server_refuses_foreign_hosts_and_cross_site_posts(inspector):
    from glassllm.inspector.server import create_app

    with TestClient(create_app(inspector), base_url=BASE) as c:
        assert c.get("/api/info", headers={"Host": "evil.example"}).status_code == 403
        assert c.post("/api/tokens", json={"prompt": "hi"}, headers={"Origin": "http://evil.example"}).status_code == 403


# ----------------------------------------------------------------------------
# Static files
# ----------------------------------------------------------------------------

TRAVERSALS = ["/../../../../etc/passwd", "/%2e%2e/%2e%2e/%2e%2e/etc/passwd", "/..%2f..%2f..%2fetc%2fpasswd",
              "/static/../server.py", "/static/%2e%2e/server.py", "/app.js/../server.py", "/%2e%2e%5cserver.py",
              "/server.py", "/auth.py", "/__init__.py", "/static/app.js", "/app.js%00.txt", "/....//server.py",
              "/js/../server.py", "/js/%2e%2e/assets.py", "/js/main.js/../../server.py", "/js/main.js%00.txt",
              "//etc/passwd", "/%252e%252e/server.py", "/static/..%5c..%5cserver.py"]


@pytest.mark.parametrize("path", TRAVERSALS)
def test_path_traversal_on_static_files_reaches_nothing(client, path):
    import glassllm.inspector.server as srv
    from pathlib import Path

    secret = Path(srv.__file__).read_text(encoding="utf-8")[:200]
    r = client.get(path, headers=AUTH)
    assert r.status_code in (400, 404), (path, r.status_code)
    assert "root:" not in r.text and secret not in r.text and "def " not in r.text, (path, r.text[:200])


def test_the_static_files_are_the_packaged_ones(client):
    from glassllm.inspector.server import read_assets

    assets = read_assets()
    for name in assets:
        path = "/" if name == "index.html" else "/" + name
        assert client.get(path, headers=AUTH).text == assets[name]


def test_every_answer_carries_the_security_headers(client):
    for r in [client.get("/", headers=AUTH), client.get("/api/info"), client.get("/api/info", headers=AUTH)]:
        assert "default-src 'none'" in r.headers["content-security-policy"]
        assert r.headers["x-content-type-options"] == "nosniff" and r.headers["referrer-policy"] == "no-referrer"


def test_error_answers_name_no_secret(client):
    for r in [client.get("/api/info"), client.get("/nope", headers=AUTH),
              client.post("/api/next", content=json.dumps({"prompt": 1}), headers=AUTH)]:
        assert TOKEN not in r.text


# ----------------------------------------------------------------------------
# Bodies: too large, too slow
# ----------------------------------------------------------------------------

def test_an_oversized_body_gets_413_on_every_post_route_before_it_is_read(client, app):
    posts = [path for method, path in routes(app) if method == "POST"]
    for path in posts:
        r = client.post(path, content=b'{"prompt": "' + b"a" * 300_000 + b'"}', headers={
            **AUTH, "Content-Type": "application/json"})
        assert r.status_code == 413 and "too large" in r.json()["error"], (path, r.status_code, r.text[:100])


def serve(app, **kw):
    from glassllm.inspector.server import Server

    return Server(app, "127.0.0.1", 0, **kw).start()


def raw_request(port, head: bytes, source="127.0.0.1", timeout=10):
    import socket

    s = socket.create_connection(("127.0.0.1", port), timeout=timeout, source_address=(source, 0))
    s.sendall(head)
    return s


def test_a_declared_body_that_never_arrives_whole_gets_408_real_socket(inspector, monkeypatch):
    """Without the body deadline the server would wait forever; a claimed 12 TB body is refused unread."""
    from glassllm.inspector import server as srv

    monkeypatch.setattr(srv, "BODY_TIMEOUT_S", 0.5)
    s = serve(make_app(inspector))
    try:
        with raw_request(s.port, b"POST /api/tokens HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                 b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: 100\r\n\r\n{") as c:
            answer = c.recv(65536).decode()
        assert answer.startswith("HTTP/1.1 408"), answer[:200]
        with raw_request(s.port, b"POST /api/tokens HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                 b"Content-Length: 12000000000000\r\n\r\n") as c:
            answer = c.recv(65536).decode()
        assert answer.startswith("HTTP/1.1 413") or answer.startswith("HTTP/1.1 401"), answer[:200]
    finally:
        s.stop()


def test_a_slow_body_gets_408_and_holds_no_worker(inspector, monkeypatch):
    """A body trickled a byte at a time: 408 at the deadline, and meanwhile a one-worker pool serves others."""
    import threading
    import time

    import httpx

    from glassllm.inspector import server as srv
    from glassllm.inspector.pool import WorkPool

    monkeypatch.setattr(srv, "BODY_TIMEOUT_S", 3.0)
    s = serve(make_app(inspector, pool=WorkPool(1, queue=0)))
    answers = []

    def slow():
        with raw_request(s.port, b"POST /api/tokens HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Type: application/json\r\n"
                                 b"Authorization: Bearer " + TOKEN.encode() + b"\r\nContent-Length: 40\r\n\r\n") as c:
            c.settimeout(10)
            try:
                for ch in b'{"prompt": "once upon a time, slowly"}':
                    c.sendall(bytes([ch]))
                    time.sleep(0.2)
            except OSError:
                pass                                     # the server answered and closed first
            answers.append(c.recv(65536).decode())

    try:
        t = threading.Thread(target=slow)
        t.start()
        time.sleep(0.3)
        with httpx.Client(base_url=f"http://127.0.0.1:{s.port}", headers=AUTH, timeout=10) as c:
            r = c.post("/api/tokens", json={"prompt": "once upon a time"})
        assert r.status_code == 200 and not answers, (r.text[:200], answers)   # served while the body trickles
        t.join(15)
        assert answers and answers[0].startswith("HTTP/1.1 408"), answers
    finally:
        s.stop()


# ----------------------------------------------------------------------------
# Connections that send nothing
# ----------------------------------------------------------------------------

def closed_by_server(sock, within: float) -> bool:
    import socket
    import time

    sock.settimeout(0.05)
    deadline = time.monotonic() + within
    while time.monotonic() < deadline:
        try:
            if sock.recv(1024) == b"":
                return True
        except socket.timeout:
            continue
        except OSError:
            return True
    return False


def test_many_idle_connections_are_capped_per_client_and_closed_at_the_header_deadline(inspector):
    import time

    import httpx

    s = serve(make_app(inspector), head_timeout=1.0, per_client=20)
    idle = []
    try:
        for i in range(60):
            # nothing at all, or half a request line: a slowloris
            idle.append(raw_request(s.port, b"" if i % 2 else b"GET / HTTP/1.1\r\nHost: 127.0"))
        time.sleep(0.2)
        # Another client is served at once, idle sockets or not.
        transport = httpx.HTTPTransport(local_address="127.0.0.2")
        with httpx.Client(base_url=f"http://127.0.0.1:{s.port}", headers=AUTH, transport=transport, timeout=5) as c:
            assert c.get("/api/info").status_code == 200
        # One address holds at most 20 of them: the rest were closed on arrival.
        early = sum(closed_by_server(sock, 0.05) for sock in idle)
        assert early >= 40, early
        # And none outlives the header deadline.
        assert all(closed_by_server(sock, 3.0) for sock in idle)
        assert s.protocol.open_by_client.get("127.0.0.1", 0) == 0
    finally:
        for sock in idle:
            sock.close()
        s.stop()


def test_a_kept_alive_connection_that_trickles_its_next_request_is_closed(inspector):
    import time

    s = serve(make_app(inspector, token=None), head_timeout=1.0)
    try:
        with raw_request(s.port, b"GET /api/info HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n") as c:
            c.settimeout(5)
            assert c.recv(65536).startswith(b"HTTP/1.1 200")
            for ch in b"GET /api/info HTTP/1.1\r\nHost: 1":
                try:
                    c.sendall(bytes([ch]))
                except OSError:
                    break
                time.sleep(0.1)
            assert closed_by_server(c, 3.0)
    finally:
        s.stop()


# ----------------------------------------------------------------------------
# Bounded work: a full pool answers 503, a fast client 429
# ----------------------------------------------------------------------------

def test_a_full_pool_answers_503_with_retry_after_instead_of_piling_up(inspector, monkeypatch):
    import threading
    import time

    import httpx

    from glassllm.inspector.pool import WorkPool

    gate = threading.Event()
    real = inspector.next_token

    def held(req):
        gate.wait(10)
        return real(req)

    monkeypatch.setattr(inspector, "next_token", held)
    pool = WorkPool(1, queue=1)
    s = serve(make_app(inspector, pool=pool))
    statuses = []
    try:
        def one(prompt):
            with httpx.Client(base_url=f"http://127.0.0.1:{s.port}", headers=AUTH, timeout=10) as c:
                statuses.append(c.post("/api/next", json={"prompt": prompt}))
        threads = [threading.Thread(target=one, args=(p,)) for p in ("Tom ran.", "Mia sat.")]
        for t in threads:
            t.start()
        deadline = time.monotonic() + 10
        while pool.admitted < 2 and time.monotonic() < deadline:    # one running, one waiting
            time.sleep(0.01)
        assert pool.admitted == 2
        with httpx.Client(base_url=f"http://127.0.0.1:{s.port}", headers=AUTH, timeout=10) as c:
            r = c.post("/api/next", json={"prompt": "Ben sat."})
            assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1, r.text
            assert "busy" in r.json()["error"]
            assert c.get("/api/info").status_code == 200           # nothing to compute: still answered
        gate.set()
        for t in threads:
            t.join(10)
        assert [r.status_code for r in statuses] == [200, 200]
        assert pool.admitted == 0
    finally:
        gate.set()
        s.stop()


def test_the_logit_lens_and_attribution_take_a_worker_like_every_pass_of_the_model(inspector, monkeypatch):
    """The attribution runs the model on every call, the lens for every window not yet computed: with the one
    worker busy and no queue, they are refused, not run."""
    import threading
    import time

    import httpx

    from glassllm.inspector.pool import WorkPool

    gate = threading.Event()
    real = inspector.next_token
    monkeypatch.setattr(inspector, "next_token", lambda req: gate.wait(10) and real(req))
    pool = WorkPool(1, queue=0)
    s = serve(make_app(inspector, pool=pool))
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{s.port}", headers=AUTH, timeout=10) as c:
            def hold():                       # a prompt no other test traced: it needs the worker
                with httpx.Client(base_url=f"http://127.0.0.1:{s.port}", headers=AUTH, timeout=10) as h:
                    h.post("/api/next", json={"prompt": "Zed hid a key under a log."})
            held = threading.Thread(target=hold)
            held.start()
            deadline = time.monotonic() + 10
            while pool.admitted < 1 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert pool.admitted == 1
            for path, body in (("/api/lens", {"prompt": "Mia sat."}), ("/api/attribution", {"prompt": "Mia sat."})):
                r = c.post(path, json=body)
                assert r.status_code == 503 and int(r.headers["retry-after"]) >= 1, (path, r.status_code, r.text[:200])
            gate.set()
            held.join(10)
            assert c.post("/api/lens", json={"prompt": "Mia sat."}).status_code == 200
            assert c.get("/api/stats").json()["pool"]["refused_503"] == 2
    finally:
        gate.set()
        s.stop()


def test_freed_heap_memory_goes_back_to_the_system_when_released():
    """Blocks under glibc's mmap threshold, freed below a live one: they stay resident until released."""
    import subprocess
    import sys

    code = (
        "import numpy as np\n"
        "from glassllm.heap import release_freed_memory, resident_bytes\n"
        "blocks = [np.ones(12_000) for _ in range(600)]       # 96 KB each, 58 MB: from the heap\n"
        "last = np.ones(12_000)                                # keeps the top of the heap in use\n"
        "full = resident_bytes(); del blocks\n"
        "freed = resident_bytes(); ok = release_freed_memory(); released = resident_bytes()\n"
        "print(ok, full >> 20, freed >> 20, released >> 20)\n")
    ok, full, freed, released = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                               check=True).stdout.split()
    if ok != "True":
        pytest.skip("not glibc: nothing to release")
    assert int(freed) > int(full) - 10, (full, freed)           # freeing alone gave (almost) nothing back
    assert int(released) < int(freed) - 40, (freed, released)   # releasing gave back the 58 MB


def test_the_server_releases_memory_after_a_computation_and_not_after_a_lookup(inspector, monkeypatch):
    import httpx

    from glassllm.inspector import server as srv

    calls = []
    monkeypatch.setattr(srv, "release_freed_memory", lambda: calls.append(1) or True)
    s = serve(make_app(inspector))
    body = {"prompt": "Sam found a shell.", "name": "attn.softmax", "layer": 0, "head": 0}
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{s.port}", headers=AUTH, timeout=20) as c:
            before = c.get("/api/stats").json()["cache"]
            assert c.post("/api/snapshot", json=body).status_code == 200            # traced: computed
            assert len(calls) == 1
            assert c.post("/api/snapshot", json={**body, "head": 1}).status_code == 200   # a lookup
            assert len(calls) == 1
            after = c.get("/api/stats").json()
    finally:
        s.stop()
    assert after["cache"]["computed"] == before["computed"] + 1 and after["cache"]["hits"] >= before["hits"] + 1
    assert after["cache"]["bytes"] > before["bytes"] and after["rss_bytes"] > after["cache"]["bytes"]


def test_a_client_over_its_rate_gets_429_and_others_do_not(inspector):
    import httpx

    from glassllm.inspector.pool import RateLimiter

    s = serve(make_app(inspector, limiter=RateLimiter(rate=0.5, burst=3)))
    try:
        def client(address):
            return httpx.Client(base_url=f"http://127.0.0.1:{s.port}", headers=AUTH, timeout=10,
                                transport=httpx.HTTPTransport(local_address=address))
        with client("127.0.0.3") as fast, client("127.0.0.4") as other:
            got = [fast.get("/api/info").status_code for _ in range(4)]
            assert got == [200, 200, 200, 429], got
            r = fast.get("/api/info")
            assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1 and "too many" in r.json()["error"]
            assert other.get("/api/info").status_code == 200
            # Guessing the token counts too: the limit comes before the token check.
            with client("127.0.0.5") as guesser:
                guesses = [guesser.get("/api/info", headers={"Authorization": f"Bearer guess-{i:04d}"}).status_code
                           for i in range(5)]
            assert guesses == [401, 401, 401, 429, 429], guesses
    finally:
        s.stop()


def test_the_rate_limiter_refills_at_its_rate():
    from glassllm.inspector.pool import RateLimiter

    now = [0.0]
    limiter = RateLimiter(rate=2.0, burst=2, clock=lambda: now[0])
    assert [limiter.wait("a") for _ in range(3)] == [0.0, 0.0, 0.5]
    now[0] = 0.5                                                   # one token back
    assert limiter.wait("a") == 0.0 and limiter.wait("a") == 0.5      # empty again: a whole token to wait for
    assert limiter.wait("b") == 0.0                                # every client has its own bucket


# ----------------------------------------------------------------------------
# The trace cache
# ----------------------------------------------------------------------------

def _reference(model, tok, req):
    """The same request to a fresh inspector with an empty cache of its own."""
    from glassllm.inspector import Inspector, Limits

    return Inspector(model, tok, Limits(max_prompt_tokens=32, max_new_tokens=4, max_cells=4096)).snapshot(req)


def test_the_cache_never_returns_another_prompts_numbers(env):
    """Many prompts (same length, one token apart), interventions and targets through one small cache,
    from many threads at once: every answer equals a fresh inspector's for that very request."""
    import threading

    import numpy as np

    from glassllm.inspector import Inspector, Limits
    from glassllm.inspector.cache import TraceCache
    from glassllm.inspector.schema import Intervention, SnapshotRequest

    words = ["ball", "cat", "tree", "boat", "cake", "kite"]
    prompts = [f"Once upon a time, Tom had a {w}." for w in words] + [f"Once upon a time, Tom had a {w}!" for w in words]
    ivs = [None, Intervention(kind="ablate", layer=0, head=1), Intervention(kind="temperature", layer=1, temperature=2.0)]
    reqs = [SnapshotRequest(prompt=p, name=name, layer=layer, head=h, grad=g, intervention=iv)
            for p in prompts for iv in ivs
            for (name, layer, h, g) in [("attn.softmax", 1, 0, False), ("resid_post", 0, None, True)]]
    reqs += [SnapshotRequest(prompt=prompts[0], name="resid_post", layer=0, grad=True, target=t) for t in (5, 6)]
    reqs += [SnapshotRequest(prompt=prompts[0], name="attn.softmax", layer=0, head=1, step=s) for s in (1, 2, 3)]
    want = [_reference(env.model, env.tok, r)["values"]["b64"] for r in reqs]
    assert len(set(want)) == len(reqs)                                 # every request really differs

    cache = TraceCache(max_bytes=600_000)                              # a few passes: evictions all along
    shared = Inspector(env.model, env.tok, Limits(max_prompt_tokens=32, max_new_tokens=4, max_cells=4096),
                       cache=cache)
    # A second model of the same shape, different weights, in the same cache: its numbers are its own.
    from glassllm.nn import Transformer
    from tests.support.glassllm_testing import randomize
    other_model = randomize(Transformer(env.model.config, seed=5), np.random.default_rng(7))
    other = Inspector(other_model, env.tok, shared.limits, cache=cache)
    want_other = [_reference(other_model, env.tok, r)["values"]["b64"] for r in reqs[:6]]

    rng = np.random.default_rng(0)
    order = [int(i) for i in rng.integers(0, len(reqs), size=300)]
    wrong = []

    def worker(part):
        for i in part:
            got = shared.snapshot(reqs[i])["values"]["b64"]
            if got != want[i]:
                wrong.append(i)
            if i < 6 and other.snapshot(reqs[i])["values"]["b64"] != want_other[i]:
                wrong.append(("other", i))

    threads = [threading.Thread(target=worker, args=(order[k::6],)) for k in range(6)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not wrong, wrong
    stats = cache.stats()
    assert stats["evicted"] > 0 and stats["hits"] > 0 and stats["bytes"] <= cache.max_bytes, stats


def test_switching_views_on_a_traced_prompt_computes_nothing(inspector, monkeypatch):
    from glassllm.inspector import runs
    from glassllm.inspector.schema import SnapshotRequest

    calls = []
    real = runs.trace_prompt
    monkeypatch.setattr(runs, "trace_prompt", lambda *a: calls.append(a) or real(*a))
    prompt = "Tom gave the kite to Mia."
    inspector.snapshot(SnapshotRequest(prompt=prompt, name="attn.softmax", layer=0, head=0))
    first = len(calls)
    assert first >= 1
    for entry in inspector.info()["names"]:
        for layer in (range(inspector.config.n_layers) if entry["in_layer"] else [None]):
            for head in (range(entry["heads"]) if entry["heads"] else [None]):
                for grad in (False, True):
                    if grad and (entry["name"] == "probs" or entry["name"].endswith("attn.mask")):
                        continue
                    inspector.snapshot(SnapshotRequest(prompt=prompt, name=entry["name"], layer=layer, head=head,
                                                       grad=grad))
    assert len(calls) == first, f"{len(calls) - first} passes recomputed while switching views"


def test_identical_concurrent_requests_are_computed_once(inspector, monkeypatch):
    import threading
    import time

    from glassllm.inspector import runs
    from glassllm.inspector.schema import SnapshotRequest

    calls = []
    real = runs.trace_prompt

    def slow(*a):
        calls.append(a)
        time.sleep(0.3)                                   # long enough for every thread to arrive meanwhile
        return real(*a)

    monkeypatch.setattr(runs, "trace_prompt", slow)
    req = SnapshotRequest(prompt="Lily gave the boat to Ben.", name="attn.softmax", layer=1, head=2)
    answers = []
    threads = [threading.Thread(target=lambda: answers.append(inspector.snapshot(req))) for _ in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(answers) == 8 and len({a["values"]["b64"] for a in answers}) == 1
    assert len(calls) == 1, len(calls)        # one pass, its gradient included: computed once for all 8


def test_the_cache_stays_within_its_bytes():
    from glassllm.inspector.cache import TraceCache

    cache = TraceCache(max_bytes=100)
    for i in range(50):
        cache.get(i, lambda: i, size=lambda v: 30)
    s = cache.stats()
    assert s["bytes"] == 90 and s["entries"] == 3 and s["evicted"] == 47
    assert cache.peek(49) == 49 and cache.peek(0) is None
    cache.get("huge", lambda: "x", size=lambda v: 1000)           # computed, returned, not kept
    assert cache.peek("huge") is None and cache.stats()["bytes"] == 90


def test_a_view_switch_on_a_traced_prompt_does_not_wait_behind_a_new_prompt(inspector, monkeypatch):
    """The model's one worker is busy with a new prompt; switching views on a traced one is answered meanwhile."""
    import threading

    import httpx

    from glassllm.inspector import runs
    from glassllm.inspector.pool import WorkPool

    traced = "Ben had a red boat."
    body = {"prompt": traced, "name": "attn.softmax", "layer": 0, "head": 0}
    gate = threading.Event()
    real = runs.trace_prompt
    s = serve(make_app(inspector, pool=WorkPool(1, queue=4)))
    try:
        with httpx.Client(base_url=f"http://127.0.0.1:{s.port}", headers=AUTH, timeout=20) as c:
            assert c.post("/api/snapshot", json=body).status_code == 200
            monkeypatch.setattr(runs, "trace_prompt", lambda *a: gate.wait(20) and real(*a))
            blocked = threading.Thread(target=lambda: c.post("/api/next", json={"prompt": "Mia had a kite."}))
            blocked.start()
            for layer in range(2):
                r = c.post("/api/snapshot", json={**body, "layer": layer, "head": 1})
                assert r.status_code == 200 and blocked.is_alive(), r.text[:200]
            gate.set()
            blocked.join(20)
    finally:
        gate.set()
        s.stop()
