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

from test_reliability_inventory import get_env  # noqa: E402

TOKEN = "test-token-of-the-class-0123456789"
BASE = "http://127.0.0.1"


@pytest.fixture(scope="module")
def env():
    return get_env()


@pytest.fixture(scope="module")
def inspector(env):
    from glassllm.inspector import Inspector, Limits

    return Inspector(env.model, env.tok, Limits(max_prompt_tokens=32, max_new_tokens=4, max_cells=4096))


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
    for path in ("/", "/app.js", "/api/info"):
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
    for name, path in [("index.html", "/"), ("app.js", "/app.js"), ("style.css", "/style.css")]:
        assert client.get(path, headers=AUTH).text == assets[name]


def test_every_answer_carries_the_security_headers(client):
    for r in [client.get("/", headers=AUTH), client.get("/api/info"), client.get("/api/info", headers=AUTH)]:
        assert "default-src 'none'" in r.headers["content-security-policy"]
        assert r.headers["x-content-type-options"] == "nosniff" and r.headers["referrer-policy"] == "no-referrer"


def test_error_answers_name_no_secret(client):
    for r in [client.get("/api/info"), client.get("/nope", headers=AUTH),
              client.post("/api/next", content=json.dumps({"prompt": 1}), headers=AUTH)]:
        assert TOKEN not in r.text
