"""The extender's HTTP server (kube-scheduler's calls), on aiohttp.

``serve(handler, host, port, health=...)`` answers HTTP/1.1 requests on keep-alive
connections: ``handler(method, path, query, body)`` (``body``: the request's bytes, which the
handler decodes: HiveD answers a body that is not JSON in each path's own way) returns
``Reply(status, json_body)``. ``GET /livez`` answers 200 while the process runs; ``GET
/healthz`` and ``GET /readyz`` answer ``health()``'s reply when one is given (the extender's:
503 while it cannot reach the Kubernetes API or the store), else go to ``handler``. A body over
``MAX_BODY`` is 413 (before a byte of it is read), one that does not arrive within
``READ_TIMEOUT_S`` 408; a request aiohttp cannot parse is its 400; a handler that raises gets
500 with the error's text (logged); a peer never crashes the server. A port that cannot be
bound raises ``OSError`` from ``serve``. (The extender's
calls to the Kubernetes API go through ``kubernetes_asyncio``: ``cluster_state.k8s.kube``.)
"""

from __future__ import annotations

import asyncio
import json
import logging
import socket
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any

from aiohttp import web

from consensus.runtime.tls import listening_socket

__all__ = ["HttpError", "Reply", "WebServer", "serve"]

log = logging.getLogger(__name__)

#: bounds on what a peer may send: a request body
MAX_BODY = 16 * 1024 * 1024
#: how long a connection may sit idle between requests, and a request's body take to arrive
IDLE_TIMEOUT_S = 60.0
READ_TIMEOUT_S = 10.0
#: the paths ``serve`` answers itself: the process runs; it can do its work
LIVE_PATH = "/livez"
READY_PATHS = ("/healthz", "/readyz")


class HttpError(Exception):
    def __init__(self, status: int, message: str) -> None:
        super().__init__(f"HTTP {status}: {message}")
        self.status = status
        self.message = message


@dataclass(frozen=True, slots=True)
class Reply:
    status: int
    body: Any


Handler = Callable[[str, str, dict[str, list[str]], bytes], Awaitable[Reply]]
Health = Callable[[], Awaitable[Reply]]


class WebServer:
    """What ``serve`` runs: an aiohttp application on a listening socket."""

    def __init__(self, runner: web.AppRunner, sock: socket.socket) -> None:
        self._runner = runner
        self.sockets = [sock]

    async def stop(self) -> None:
        """Stop listening and end the connections still open."""
        await self._runner.cleanup()


def _json(status: int, body: Any) -> web.Response:
    return web.Response(status=status, text=json.dumps(body), content_type="application/json")


async def serve(handler: Handler, host: str, port: int, *, health: Health | None = None
                ) -> WebServer:
    """Answer HTTP requests with ``handler`` on ``host:port`` (port 0: any free port); see
    the module. ``OSError`` when the port cannot be bound (taken, say)."""

    async def dispatch(request: web.Request) -> web.StreamResponse:
        if request.method == "GET" and request.path == LIVE_PATH:
            return _json(200, {"status": "ok"})
        if request.method == "GET" and request.path in READY_PATHS and health is not None:
            answer = await health()
            return _json(answer.status, answer.body)
        if (request.content_length or 0) > MAX_BODY:
            return _json(413, {"error": f"body over {MAX_BODY} bytes"})
        try:
            async with asyncio.timeout(READ_TIMEOUT_S):
                body = await request.read() if request.can_read_body else b""
        except TimeoutError:
            return _json(408, {"error": f"body not sent within {READ_TIMEOUT_S:g} s"})
        query = {key: request.query.getall(key) for key in request.query}
        try:
            answer = await handler(request.method, request.path, query, body)
        except HttpError as exc:
            answer = Reply(exc.status, {"error": exc.message})
        except Exception as exc:  # a bug answers 500, and the server goes on
            log.exception("%s %s failed", request.method, request.path)
            answer = Reply(500, {"error": f"{type(exc).__name__}: {exc}"})
        return _json(answer.status, answer.body)

    app = web.Application(client_max_size=MAX_BODY)
    app.router.add_route("*", "/{path:.*}", dispatch)
    runner = web.AppRunner(app, handle_signals=False, access_log=None,
                           keepalive_timeout=IDLE_TIMEOUT_S)
    await runner.setup()
    try:
        sock = await listening_socket(host, port)
        await web.SockSite(runner, sock).start()
    except BaseException:
        await runner.cleanup()
        raise
    return WebServer(runner, sock)
