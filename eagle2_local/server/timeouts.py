"""Connections that send nothing are closed: uvicorn's own keep-alive timer starts only after a response, and any
byte received stops it, so a client that connects and stays silent, or sends half a request head a byte at a
time, would hold its connection (a socket, a protocol object) for ever.

:func:`head_timeout_protocol` gives uvicorn an HTTP/1.1 (h11) protocol that wants each request's head complete
within a deadline, counted from the connection's start and from the end of each response (on a kept-alive
connection). The body has its own deadline, in :class:`~eagle2_local.server.admission.Admission`.
"""

from __future__ import annotations

import asyncio

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol


def head_timeout_protocol(timeout_s: float) -> type[H11Protocol]:
    """An :class:`H11Protocol` that closes a connection whose next request head has not arrived within
    ``timeout_s`` seconds (for ``uvicorn.Config(http=...)``)."""

    class HeadTimeoutProtocol(H11Protocol):
        _head_timer: asyncio.TimerHandle | None = None
        _armed_cycle: object = None

        def connection_made(self, transport) -> None:  # type: ignore[override]
            super().connection_made(transport)
            self._arm()

        def connection_lost(self, exc: Exception | None) -> None:
            if self._head_timer is not None:
                self._head_timer.cancel()
            super().connection_lost(exc)

        def on_response_complete(self) -> None:
            super().on_response_complete()
            self._arm()

        def _arm(self) -> None:
            """Start waiting for a request head; a request whose head arrives makes a new cycle object."""
            if self._head_timer is not None:
                self._head_timer.cancel()
            self._armed_cycle = self.cycle
            self._head_timer = self.loop.call_later(timeout_s, self._head_overdue)

        def _head_overdue(self) -> None:
            self._head_timer = None
            idle = self.cycle is None or self.cycle.response_complete
            if self.cycle is not self._armed_cycle or not idle or self.transport.is_closing():
                return  # a request arrived (or a pipelined one runs): its response re-arms the timer
            try:
                self.conn.send(h11.ConnectionClosed())
            except h11.LocalProtocolError:
                pass
            self.transport.close()

    return HeadTimeoutProtocol
