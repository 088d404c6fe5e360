"""Connections that send nothing cannot pile up: a deadline for each request's headers, a cap per client.

uvicorn closes a kept-alive connection that stays quiet after a response, but
it waits forever for the first request on a new connection, and for a request
whose headers trickle in a byte at a time. :func:`guarded_protocol` makes its
HTTP/1.1 protocol close a connection whose request line and headers have not
all arrived ``head_timeout`` seconds after the connection opened (or after
the previous response), and close at once any connection beyond
``per_client`` open ones from one address. (A request body has its own
deadline in the server: 408.) Malformed HTTP that h11 refuses before the app
sees it gets the app's JSON error shape, ``{"error": "..."}``, with 400.
"""

from __future__ import annotations

import asyncio
import json

from ..checks import check_int
from ..optional import require

H11Protocol = require("uvicorn.protocols.http.h11_impl", "the inspector's server").H11Protocol
h11 = require("h11", "the inspector's server")

__all__ = ["guarded_protocol"]


def guarded_protocol(head_timeout: float, per_client: int) -> type:
    """An :class:`H11Protocol` with a deadline for request headers and a cap on connections per address."""
    if not head_timeout > 0:
        raise ValueError(f"head_timeout must be > 0 seconds, got {head_timeout!r}")
    per_client = check_int("per_client", per_client, low=1)
    open_by_client: dict[str, int] = {}

    class GuardedProtocol(H11Protocol):
        def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._address = self.client[0] if self.client else ""
            self._counted = False
            self._head_timer: asyncio.TimerHandle | None = None
            self._seen = None
            if open_by_client.get(self._address, 0) >= per_client:
                transport.close()                        # one address may not hold every socket
                return
            open_by_client[self._address] = open_by_client.get(self._address, 0) + 1
            self._counted = True
            self._arm()

        def _arm(self) -> None:
            if self._head_timer is None:
                self._head_timer = self.loop.call_later(head_timeout, self._head_too_slow)

        def _disarm(self) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
                self._head_timer = None

        def _head_too_slow(self) -> None:
            self._head_timer = None
            if not self.transport.is_closing():
                self.transport.close()

        def data_received(self, data: bytes) -> None:
            if self.cycle is None or self.cycle.response_complete:
                self._arm()                              # a new request begins: its headers have a deadline
            super().data_received(data)
            if self.cycle is not None and self.cycle is not self._seen:
                self._seen = self.cycle                  # its headers are in: the body has its own deadline
                self._disarm()

        def send_400_response(self, msg: str) -> None:
            """Malformed HTTP (a garbage request line, a bad Content-Length, two Host headers): the same
            JSON error every other refusal gets, then the connection is closed."""
            body = json.dumps({"error": f"malformed HTTP request: {' '.join(str(msg).split())[:120]}"}).encode()
            try:
                self.transport.write(self.conn.send(h11.Response(status_code=400, reason=b"Bad Request", headers=[
                    (b"content-type", b"application/json"), (b"content-length", str(len(body)).encode()),
                    (b"connection", b"close")])))
                self.transport.write(self.conn.send(h11.Data(data=body)))
                self.transport.write(self.conn.send(h11.EndOfMessage()))
            except h11.LocalProtocolError:              # h11 can no longer answer on this connection
                pass
            self.transport.close()

        def connection_lost(self, exc: Exception | None) -> None:
            self._disarm()
            if self._counted:
                self._counted = False
                left = open_by_client.get(self._address, 1) - 1
                if left > 0:
                    open_by_client[self._address] = left
                else:
                    open_by_client.pop(self._address, None)
            super().connection_lost(exc)

    GuardedProtocol.open_by_client = open_by_client
    return GuardedProtocol
