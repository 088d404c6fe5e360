"""Who may talk to the inspector: an access token, and the server's own host names.

Modelled on Jupyter's: a random token goes into the URL the server prints; the
first visit with ``?token=...`` gets an ``HttpOnly``, ``SameSite=Strict`` cookie
and is redirected to the same page without the token in its address; after
that the browser sends the cookie. Scripts may send the token in a header
instead: ``Authorization: Bearer TOKEN`` (or ``token TOKEN``). Tokens are
compared in constant time (:func:`hmac.compare_digest`).

Independently of the token, a request must name one of the server's own hosts
(its ``Host`` header: DNS rebinding makes a foreign name point at this
machine) and, when it carries an ``Origin``, come from the server's own page
(a cross-site request, even one that carries a valid cookie or token, is
refused). API requests a browser marks ``Sec-Fetch-Site: cross-site`` or
``same-site`` are refused as well. A page link from elsewhere (a class web
page handing out the URL) is a cross-site *navigation*; it is allowed, and the
token in its URL is what lets it in.

>>> a = Access(token="s3cret-token", hosts=own_hosts("127.0.0.1"))
>>> a.token_ok("s3cret-token"), a.token_ok("s3cret-tokeN"), a.token_ok(None)
(True, False, False)
>>> a.host_ok("localhost:8765"), a.host_ok("evil.example:8765")
(True, False)
"""

from __future__ import annotations

import hashlib
import hmac
import ipaddress
import re
import secrets
import socket
from dataclasses import dataclass
from urllib.parse import urlsplit

from ..optional import require

__all__ = ["Access", "same_origin_path", "new_token", "check_token_text", "own_hosts", "host_of", "is_loopback",
           "lan_addresses",
           "TOKEN_BYTES"]

TOKEN_BYTES = 32                      # 256 bits from secrets; the floor is 128
TOKEN_TEXT = re.compile(r"[A-Za-z0-9._~-]{8,256}")
LOOPBACK_NAMES = frozenset({"127.0.0.1", "localhost", "::1"})


def new_token() -> str:
    """A fresh access token: 32 random bytes from :mod:`secrets`, URL-safe base64 (43 characters)."""
    return secrets.token_urlsafe(TOKEN_BYTES)


def check_token_text(token: str) -> str:
    """``token`` if it can travel in a URL unchanged (8-256 of ``A-Z a-z 0-9 . _ ~ -``), else ValueError."""
    if not isinstance(token, str) or not TOKEN_TEXT.fullmatch(token):
        shown = repr(token[:20] + "...") if isinstance(token, str) and len(token) > 20 else repr(token)
        raise ValueError(f"--token must be 8 to 256 characters of A-Z a-z 0-9 . _ ~ -, got {shown}")
    return token


def is_loopback(host: str) -> bool:
    """Is ``host`` (an address or ``localhost``) only reachable from this machine?"""
    if host.lower().rstrip(".") == "localhost":
        return True
    try:
        return ipaddress.ip_address(host.strip("[]")).is_loopback
    except ValueError:
        return False


def host_of(header: str) -> str:
    """The host part of a Host header, lower case, without brackets or a trailing dot:
    ``127.0.0.1:8000`` -> ``127.0.0.1``, ``[::1]:80`` -> ``::1``, ``Box.local.`` -> ``box.local``."""
    header = header.strip().lower()
    if header.startswith("["):
        return header[1:].split("]", 1)[0]
    host = header.rsplit(":", 1)[0] if header.count(":") == 1 else header
    return host.rstrip(".")


# One host (a name, an IPv4 address or a bracketed IPv6 one) and an optional port: nothing else.
HOST_HEADER = re.compile(r"(\[[0-9a-f:.]+\]|[a-z0-9._-]+)(:[0-9]{1,5})?", re.I)


def same_origin_path(path: str, raw_path: bytes | None = None) -> str:
    """Where the token exchange may send the browser: ``path`` as a path on this server.

    Leading slashes (and backslashes, which browsers read as slashes) collapse into one, so that
    ``//evil.example/`` stays ``/evil.example/`` here instead of naming another host; a path whose raw
    form encodes a slash or backslash (``/%2F%2Fevil.example``), or that holds a control character,
    goes to ``/``.

    >>> same_origin_path("//evil.example/"), same_origin_path("///x", b"/%2F%2Fx"), same_origin_path("/a/b")
    ('/evil.example/', '/', '/a/b')
    """
    if raw_path is not None and re.search(rb"%(2f|5c)", raw_path, re.I):
        return "/"
    if any(ord(c) < 32 or c == "\x7f" for c in path):
        return "/"
    return "/" + path.replace("\\", "/").lstrip("/")


def lan_addresses() -> list[str]:
    """This machine's non-loopback IPv4 addresses (the ones to hand out), best effort."""
    found = []
    try:
        psutil = require("psutil", "listing this machine's addresses")
        for addrs in psutil.net_if_addrs().values():
            found += [a.address for a in addrs if a.family == socket.AF_INET]
    except Exception:  # noqa: BLE001 -- psutil missing or refused: fall back to the host name
        try:
            found = [info[4][0] for info in socket.getaddrinfo(socket.gethostname(), None, socket.AF_INET)]
        except OSError:
            found = []
    return sorted({a for a in found if not ipaddress.ip_address(a).is_loopback})


def own_hosts(bind: str, extra: tuple[str, ...] = ()) -> frozenset[str]:
    """The names a request may put in its Host header to reach a server bound to ``bind``.

    Loopback names always; the bound address itself; for an unspecified address
    (``0.0.0.0``, ``::``) every address of this machine's interfaces and its host
    names (``name``, ``name.local``, the fully qualified name); plus ``extra``
    (``--allow-host``: a DNS name or proxy in front of the server).
    """
    names = set(LOOPBACK_NAMES) | {host_of(bind)} | {host_of(e) for e in extra}
    try:
        unspecified = ipaddress.ip_address(bind.strip("[]")).is_unspecified
    except ValueError:
        unspecified = False
    if unspecified:
        names.update(lan_addresses())
        try:
            psutil = require("psutil", "listing this machine's addresses")
            names.update(a.address.split("%")[0].lower() for addrs in psutil.net_if_addrs().values()
                         for a in addrs if a.family == socket.AF_INET6)
        except Exception:  # noqa: BLE001
            pass
        hostname = socket.gethostname().lower()
        names.update({hostname, f"{hostname}.local", socket.getfqdn().lower()})
    return frozenset(n for n in names if n)


def _digest(token: str, purpose: bytes) -> str:
    return hmac.new(token.encode("utf-8"), purpose, hashlib.sha256).hexdigest()


@dataclass(frozen=True)
class Access:
    """The rules one server applies: its token (None: open) and its own host names."""

    token: str | None
    hosts: frozenset[str]

    @property
    def cookie_name(self) -> str:
        """A name of the cookie's own per token, so two inspectors on one machine keep separate cookies."""
        return "glassllm-" + (_digest(self.token, b"cookie name")[:12] if self.token else "open")

    @property
    def cookie_value(self) -> str:
        """What the cookie holds: a digest of the token (a leaked cookie does not reveal the token)."""
        assert self.token is not None
        return _digest(self.token, b"cookie value")

    def token_ok(self, candidate: str | None) -> bool:
        """Does ``candidate`` equal the token? Constant time in the token's content."""
        if self.token is None:
            return True
        if candidate is None:
            return False
        return hmac.compare_digest(candidate.encode("utf-8", "surrogateescape"), self.token.encode("utf-8"))

    def cookie_ok(self, candidate: str | None) -> bool:
        if self.token is None:
            return True
        return candidate is not None and hmac.compare_digest(candidate.encode("utf-8", "surrogateescape"),
                                                             self.cookie_value.encode("ascii"))

    def header_token(self, authorization: str | None) -> str | None:
        """The token of an ``Authorization: Bearer TOKEN`` (or ``token TOKEN``) header, else None."""
        if not authorization:
            return None
        scheme, _, value = authorization.strip().partition(" ")
        return value.strip() if scheme.lower() in ("bearer", "token") else None

    def host_ok(self, header: str | None) -> bool:
        """Does a Host header name this server -- one host, and one of its own (``127.0.0.1:P, evil.example``
        is refused)?"""
        return bool(header) and HOST_HEADER.fullmatch(header.strip()) is not None and host_of(header) in self.hosts

    def origin_ok(self, origin: str | None, host_header: str | None) -> bool:
        """An Origin header is fine when absent, or when it is this very server as the request named it."""
        if origin is None:
            return True
        parts = urlsplit(origin.strip().lower())
        if parts.scheme not in ("http", "https") or not parts.netloc or not host_header:
            return False                                   # "null" (a sandboxed or file page), garbage
        return parts.netloc == host_header.strip().lower() and host_of(parts.netloc) in self.hosts
