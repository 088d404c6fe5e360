"""The inspector's local web server: a FastAPI app over :class:`~glassllm.inspector.data.Inspector`.

Routes, and nothing else::

    GET  /              the page (static/index.html)
    GET  /js/<name>.js  its scripts, one per feature (assets.SCRIPTS)
    GET  /style.css     its styles
    GET  /api/info      model shape, snapshot names, vocabulary, limits
    POST /api/tokens    {"prompt"} -> the prompt's ids and pieces
    POST /api/snapshot  one slice of one snapshot (see schema.SnapshotRequest)
    POST /api/next      the next-token logits, survivors, before/after an intervention
    POST /api/heads     every layer's and head's attention weights (or gradients), for the head grid
    POST /api/timeline  {} -> the training run's probe history (when the model has one)
    POST /api/lens      {"prompt", "positions"?: [start, stop)} -> the logit lens over one window of positions
                        (default the last 16): each residual stream's top token per position
    POST /api/attribution  each head's and MLP's share of one logit (see schema.AttributionRequest)
    GET  /api/stats     what the server holds and has refused: the trace cache, the pool, RSS

The page's files are read from the package once, when the app is made, and
served from memory: no part of a request's path ever reaches the filesystem.
There are no API docs routes. Every bad request -- malformed JSON, a field of
the wrong type or range, an unknown snapshot, a prompt that is too long --
gets HTTP 400 and ``{"error": "<one line>"}`` (so does a POST without a
Content-Length); unknown paths get 404 in the same shape. Errors inside the
model are bugs: they are logged and answered with 500 and a generic message,
never a traceback.

Before any route, every request passes the guards, in this order:

- its ``Host`` must be one of the server's own names, and an ``Origin`` must be
  the server's own page (403; :mod:`.auth`);
- with a token (:class:`~glassllm.inspector.auth.Access`), it must carry the
  token: a cookie, an ``Authorization`` header or ``?token=`` (401: a JSON
  error under ``/api/``, a short page elsewhere); the first visit of a page
  with ``?token=`` gets the cookie and a redirect to the address without it;
- a body may hold at most 256 KB (413) and must arrive within
  ``BODY_TIMEOUT_S`` of its headers (408).
"""

from __future__ import annotations

import asyncio
import json
import logging
import threading
from urllib.parse import urlencode

from ..optional import require

require("fastapi", "the inspector's server")
from fastapi import FastAPI, Request  # noqa: E402  (the line above names the extra when fastapi is missing)
from fastapi.exceptions import RequestValidationError
from fastapi.responses import HTMLResponse, JSONResponse, RedirectResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.requests import ClientDisconnect

from ..checks import check_int
from ..heap import release_freed_memory, resident_bytes
from .assets import ASSETS, read_assets
from .auth import Access, is_loopback, own_hosts, same_origin_path
from .data import Inspector
from .pool import Busy, Limited, RateLimiter, WorkPool
from .schema import (
    AttributionRequest, HeadsRequest, LensRequest, NextRequest, PromptRequest, SnapshotRequest, TimelineRequest,
    describe_validation_error,
)

__all__ = ["create_app", "read_assets", "is_loopback", "Server", "Access"]

MAX_BODY_BYTES = 256 * 1024
BODY_TIMEOUT_S = 10.0  # to receive a declared body, at most 256 KB, once its headers have arrived
HEAD_TIMEOUT_S = 10.0  # to receive a request's line and headers, on a new or kept-alive connection
CONNECTIONS_PER_CLIENT = 64  # open connections one address may hold (a browser opens about 6)
# The page loads its own script and style and talks only to this server.
CSP = ("default-src 'none'; script-src 'self'; style-src 'self'; img-src 'self' data:; "
       "connect-src 'self'; base-uri 'none'; form-action 'none'; frame-ancestors 'none'")
UNAUTHORIZED_PAGE = """<!doctype html>
<html lang="en"><head><meta charset="utf-8"><title>glassllm inspector: access token needed</title></head>
<body><h1>Access token needed</h1>
<p>This inspector needs its access token. Open it with the full link you were given: it ends in
<code>?token=</code> followed by the token.</p></body></html>
"""

log = logging.getLogger("glassllm.inspector")


def _error(status: int, message: str) -> JSONResponse:
    return JSONResponse({"error": message}, status_code=status)


def _secured(response: Response) -> Response:
    response.headers["Content-Security-Policy"] = CSP
    response.headers["X-Content-Type-Options"] = "nosniff"
    response.headers["Cache-Control"] = "no-store"
    response.headers["Referrer-Policy"] = "no-referrer"
    return response


def create_app(inspector: Inspector, prompt: str | None = None, access: Access | None = None,
               tab: str | None = None, pool: WorkPool | None = None, limiter: RateLimiter | None = None) -> FastAPI:
    """The FastAPI app serving ``inspector``.

    ``prompt``: the prompt the page opens with; ``tab``: the tab it opens on (``"training"`` for a run).
    ``access``: the token and the server's own host names (default: no token, loopback names only).
    ``pool``: where the model's work runs (default: one worker per core, 32 waiting at most); requests
    the trace cache can answer run on a second pool of the same size.
    ``limiter``: requests per second per client address (default: none; ``glassllm inspect`` sets one).
    """
    access = access or Access(token=None, hosts=own_hosts("127.0.0.1"))
    pool = pool or WorkPool()
    lookups = WorkPool(pool.workers, pool.queue)             # answers from traced passes: slicing only
    assets = read_assets()
    info_cache = {**inspector.info(), "prompt": prompt, "tab": tab}
    # redirect_slashes=False: "/api/tokens/" is an unknown path (404 with a JSON error), not a redirect.
    app = FastAPI(title="glassllm inspector", docs_url=None, redoc_url=None, openapi_url=None,
                  redirect_slashes=False)

    # -- errors: one JSON line each ------------------------------------------------
    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        return _error(400, describe_validation_error(list(exc.errors())))

    @app.exception_handler(ValueError)
    async def _value_error(request: Request, exc: ValueError):
        return _error(400, str(exc).splitlines()[0] if str(exc) else "bad request")

    @app.exception_handler(TypeError)
    async def _type_error(request: Request, exc: TypeError):
        return _error(400, str(exc).splitlines()[0] if str(exc) else "bad request")

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, exc: StarletteHTTPException):
        message = {404: f"no such page: {request.url.path[:100]}",
                   405: f"method {request.method} is not allowed on {request.url.path[:100]}",
                   # FastAPI's words when the body is not UTF-8, or nested too deeply to parse:
                   400: ("request body is not valid JSON (UTF-8 text, not nested too deeply, integers of "
                         "at most 4,300 digits)"
                         if exc.detail == "There was an error parsing the body" else str(exc.detail))}
        return _error(exc.status_code, message.get(exc.status_code, str(exc.detail)))

    @app.exception_handler(Busy)
    async def _busy(request: Request, exc: Busy):
        return _secured(JSONResponse({"error": str(exc)}, status_code=503,
                                     headers={"Retry-After": str(exc.retry_after)}))

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception):
        log.exception("inspector: internal error on %s", request.url.path)
        return _error(500, f"internal error ({type(exc).__name__}); see the server's log")

    # -- guards on every request -----------------------------------------------------
    @app.middleware("http")
    async def _guard(request: Request, call_next):
        api = request.url.path.startswith("/api/")
        headers = request.headers
        if limiter is not None:   # first: it also slows down anyone guessing the token
            try:
                limiter.check(request.client.host if request.client else "")
            except Limited as e:
                return _secured(JSONResponse({"error": str(e)}, status_code=429,
                                             headers={"Retry-After": str(e.retry_after)}))
        if len(headers.getlist("host")) > 1:
            return _secured(_error(400, "a request must have one Host header"))
        if not access.host_ok(headers.get("host")):
            shown = headers.get("host", "")[:60]
            return _secured(_error(403, f"host {shown!r} is not this server's name; open the inspector at the "
                                        "address it printed"))
        if not access.origin_ok(headers.get("origin"), headers.get("host")) or (
                api and headers.get("sec-fetch-site", "same-origin") not in ("same-origin", "none")):
            return _secured(_error(403, "cross-site request refused: only the inspector's own page may call it"))
        if access.token is not None:
            given = request.query_params.get("token")
            if given is not None and request.method == "GET" and not api and access.token_ok(given):
                # The first visit: a cookie, and the same page without the token in its address.
                rest = urlencode([(k, v) for k, v in request.query_params.multi_items() if k != "token"])
                where = same_origin_path(request.scope.get("path", "/"), request.scope.get("raw_path"))
                response = RedirectResponse(where + ("?" + rest if rest else ""), status_code=303)
                response.set_cookie(access.cookie_name, access.cookie_value, httponly=True, samesite="strict",
                                    path="/")
                return _secured(response)
            if not (access.cookie_ok(request.cookies.get(access.cookie_name))
                    or access.token_ok(access.header_token(headers.get("authorization")))
                    or (given is not None and access.token_ok(given))):
                return _secured(_error(401, "this inspector needs its access token") if api
                                else HTMLResponse(UNAUTHORIZED_PAGE, status_code=401))
        length = headers.get("content-length")
        if length is not None and (not length.isdigit() or int(length) > MAX_BODY_BYTES):
            return _secured(_error(413, f"request body of {length[:20]} bytes is too large; at most {MAX_BODY_BYTES}"))
        if request.method == "POST" and (length is None or "transfer-encoding" in headers):
            # A chunked body has no declared size: it would be read whole before any check.
            return _secured(_error(400, "a request body needs a Content-Length header (chunked uploads are refused)"))
        if request.method == "POST":
            kind = headers.get("content-type", "")
            if kind.split(";")[0].strip().lower() != "application/json":
                return _secured(_error(400, f"Content-Type must be application/json, got {kind[:60]!r}"))
            try:  # a client that declares more bytes than it sends would hold the connection forever
                await asyncio.wait_for(request.body(), BODY_TIMEOUT_S)
            except asyncio.TimeoutError:
                return _secured(_error(408, f"request body incomplete: {length} bytes declared, not all sent "
                                            f"within {BODY_TIMEOUT_S:g} s"))
            except ClientDisconnect:  # the client left mid-body: nobody is there to read an answer
                log.info("inspector: a client left before sending the %s bytes it declared for %s",
                         length, request.url.path[:100])
                return _error(400, f"request body incomplete: {length} bytes declared, the client left")
        return _secured(await call_next(request))

    # -- the page: index.html at "/", every other file at its own name ----------------
    def _asset(name: str):
        body, media_type = assets[name], ASSETS[name]

        async def serve():
            return Response(body, media_type=media_type)
        return serve

    for name in ASSETS:
        app.get("/" if name == "index.html" else "/" + name, include_in_schema=False)(_asset(name))

    # -- the API -----------------------------------------------------------------------
    async def compute(fn, req, runs_model: bool = False) -> Response:
        """``fn(req)`` on a work pool, its answer encoded there too: the event loop only moves bytes.
        Every route that runs the model goes through here (503 when the pool and its queue are full).
        A request the cache can answer (``inspector.ready``; never one that ``runs_model`` every time)
        goes to a lane of its own, so that a view switch never waits behind another prompt's forward
        pass. After a computation, the memory it freed goes back to the system: the process holds the
        cache and the work under way, not the high-water mark of every pass it ran."""
        if not runs_model and inspector.ready(req):
            body = await lookups.run(_answer, fn, req, inspector.cache, False)
        else:
            body = await pool.run(_answer, fn, req, inspector.cache, True)
        return Response(body, media_type="application/json")

    app.state.compute = compute
    info_body = _dumps(info_cache)

    @app.get("/api/info")
    async def info():
        return Response(info_body, media_type="application/json")

    @app.post("/api/tokens")
    async def tokens(req: PromptRequest):
        return await compute(inspector.tokens, req)

    @app.post("/api/snapshot")
    async def snapshot(req: SnapshotRequest):
        return await compute(inspector.snapshot, req)

    @app.post("/api/next")
    async def next_token(req: NextRequest):
        return await compute(inspector.next_token, req)

    @app.post("/api/heads")
    async def heads(req: HeadsRequest):
        return await compute(inspector.heads, req)

    @app.post("/api/timeline")
    async def timeline(req: TimelineRequest):
        return await compute(lambda _: inspector.timeline_view(), req)

    @app.post("/api/lens")
    async def lens(req: LensRequest):
        return await compute(inspector.lens, req)

    @app.post("/api/attribution")
    async def attribution(req: AttributionRequest):
        return await compute(inspector.attribution, req, runs_model=True)

    @app.get("/api/stats")
    async def stats():
        """What the server holds and has refused: for the teacher watching a class."""
        return Response(_dumps({"cache": inspector.cache.stats(),
                                "pool": {"workers": pool.workers, "queue": pool.queue,
                                         "admitted": pool.admitted, "refused_503": pool.refused + lookups.refused},
                                "refused_429": limiter.refused if limiter is not None else 0,
                                "rss_bytes": resident_bytes()}),
                        media_type="application/json")

    return app


def _answer(fn, req, cache, computes: bool) -> bytes:
    """``fn(req)`` as JSON bytes. If it ran the model (``computes``, or the cache traced a pass meanwhile:
    a lookup whose entry was dropped just before), the memory the pass freed goes back to the system."""
    before = cache.stats()["computed"]
    try:
        return _dumps(fn(req))
    finally:
        if computes or cache.stats()["computed"] != before:
            release_freed_memory()


def _dumps(value) -> bytes:
    """JSON as FastAPI writes it: UTF-8, compact, no NaN."""
    return json.dumps(value, ensure_ascii=False, allow_nan=False, separators=(",", ":")).encode("utf-8")


class Server:
    """uvicorn serving an app in a background thread (for tests and ``glassllm inspect``).

    >>> server = Server(app, "127.0.0.1", 0).start()    # doctest: +SKIP
    >>> server.url                                      # doctest: +SKIP
    'http://127.0.0.1:54321/'
    >>> server.stop()                                   # doctest: +SKIP
    """

    def __init__(self, app, host: str = "127.0.0.1", port: int = 0, head_timeout: float = HEAD_TIMEOUT_S,
                 per_client: int = CONNECTIONS_PER_CLIENT):
        uvicorn = require("uvicorn", "the inspector's server")

        from .connections import guarded_protocol

        port = check_int("port", port, low=0, high=65535, note="0 = any free port")
        self.protocol = guarded_protocol(head_timeout, per_client)
        self.config = uvicorn.Config(app, host=host, port=port, log_level="warning", access_log=False,
                                     lifespan="off", http=self.protocol, timeout_keep_alive=5)
        self.server = uvicorn.Server(self.config)
        self.thread: threading.Thread | None = None
        self.host = host

    @property
    def port(self) -> int:
        sockets = [s for srv in self.server.servers for s in srv.sockets]
        return sockets[0].getsockname()[1]

    @property
    def url(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return f"http://{host}:{self.port}/"

    def start(self, timeout: float = 10.0) -> "Server":
        """Start serving in a daemon thread; return once the socket listens.

        A host that does not resolve, or an address that cannot be bound (a port
        in use), is a one-line ``ValueError`` before uvicorn is started.
        """
        import time

        problem, in_use = _bind_problem(self.host, self.config.port)
        if problem:
            raise (PortInUse if in_use else ValueError)(problem)
        self.thread = threading.Thread(target=self.server.run, name="glassllm-inspector", daemon=True)
        self.thread.start()
        deadline = time.monotonic() + timeout
        while not self.server.started:
            if not self.thread.is_alive():
                raise ValueError(f"the inspector could not listen on {self.host}:{self.config.port} "
                                 "(is the port in use?)")
            if time.monotonic() > deadline:
                raise RuntimeError("the inspector's server did not start in time")
            time.sleep(0.01)
        return self

    def stop(self) -> None:
        """Ask uvicorn to finish, and wait for its thread."""
        self.server.should_exit = True
        if self.thread is not None:
            self.thread.join(timeout=10)

    def __enter__(self):
        return self.start()

    def __exit__(self, *exc):
        self.stop()


class PortInUse(ValueError):
    """The port is taken by another program (the one bind failure where another port would do)."""


def _bind_problem(host: str, port: int) -> tuple[str | None, bool]:
    """Why ``host:port`` cannot be listened on, in one line (None if it can, as far as a test bind shows),
    and whether the reason is that the port is in use."""
    import errno
    import socket

    if not host.strip():
        return "the host is empty: give an address such as 127.0.0.1", False
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as e:
        return f"host {host!r} is not an address or a name this machine can resolve ({e.strerror})", False
    with socket.socket(family, kind, proto) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)   # as uvicorn does
        try:
            s.bind(address)
        except OSError as e:
            return f"the inspector cannot listen on {host}:{port}: {e.strerror}", e.errno == errno.EADDRINUSE
    return None, False
