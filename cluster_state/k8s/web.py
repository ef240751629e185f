"""Just enough HTTP/1.1 on asyncio for what the extender serves (kube-scheduler's calls).

``serve(handler, host, port)`` answers requests on keep-alive connections: ``handler(method,
path, query, body)`` (``body``: the request's bytes, which the handler decodes: HiveD answers
a body that is not JSON in each path's own way) returns ``Reply(status, json_body)``. A
request whose HTTP it cannot parse gets 400 and the connection is closed; a handler that
raises gets 500 with the error's text; a peer never crashes the server. (The extender's
calls to the Kubernetes API go through ``kubernetes_asyncio``: ``cluster_state.k8s.kube``.)
"""

from __future__ import annotations

import asyncio
import json
import logging
from collections.abc import Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["HttpError", "Reply", "serve"]

log = logging.getLogger(__name__)

#: bounds on what a peer may send: a request head and body
MAX_HEAD = 64 * 1024
MAX_BODY = 16 * 1024 * 1024
#: how long a connection may sit idle between requests, and a request take to arrive
IDLE_TIMEOUT_S = 60.0
READ_TIMEOUT_S = 10.0
_REASONS = {200: "OK", 201: "Created", 400: "Bad Request", 404: "Not Found",
            405: "Method Not Allowed", 409: "Conflict", 500: "Internal Server Error",
            503: "Service Unavailable"}


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


async def _read_head(reader: asyncio.StreamReader) -> list[bytes] | None:
    try:
        head = await reader.readuntil(b"\r\n\r\n")
    except asyncio.IncompleteReadError as exc:
        if exc.partial:
            raise HttpError(400, "truncated request") from None
        return None
    except asyncio.LimitOverrunError:
        raise HttpError(400, "request head too long") from None
    return head[:-4].split(b"\r\n")


def _headers(lines: list[bytes]) -> dict[str, str]:
    headers = {}
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep:
            raise HttpError(400, "malformed header")
        headers[name.strip().lower().decode("latin-1")] = value.strip().decode("latin-1")
    return headers


async def _read_body(reader: asyncio.StreamReader, headers: dict[str, str]) -> bytes:
    if headers.get("transfer-encoding", "").lower() == "chunked":
        chunks: list[bytes] = []
        total = 0
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            total += size
            if total > MAX_BODY:
                raise HttpError(400, "body too large")
            chunk = await reader.readexactly(size + 2)
            if size == 0:
                return b"".join(chunks)
            chunks.append(chunk[:-2])
    length = int(headers.get("content-length", "0") or 0)
    if not 0 <= length <= MAX_BODY:
        raise HttpError(400, "bad content length")
    return await reader.readexactly(length) if length else b""


def _encode(status: int, body: Any, *, close: bool) -> bytes:
    data = json.dumps(body).encode()
    head = (f"HTTP/1.1 {status} {_REASONS.get(status, 'Status')}\r\n"
            f"Content-Type: application/json\r\nContent-Length: {len(data)}\r\n"
            f"Connection: {'close' if close else 'keep-alive'}\r\n\r\n")
    return head.encode() + data


async def serve(handler: Handler, host: str, port: int) -> asyncio.Server:
    """Answer HTTP requests with ``handler`` on ``host:port`` (port 0: any free port)."""

    async def connection(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        try:
            while True:
                try:
                    async with asyncio.timeout(IDLE_TIMEOUT_S):
                        lines = await _read_head(reader)
                    if lines is None:
                        return
                    method, target, version = lines[0].decode("latin-1").split(" ", 2)
                    headers = _headers(lines[1:])
                    async with asyncio.timeout(READ_TIMEOUT_S):
                        body = await _read_body(reader, headers)
                except (HttpError, ValueError, UnicodeDecodeError) as exc:
                    status = exc.status if isinstance(exc, HttpError) else 400
                    writer.write(_encode(status, {"error": str(exc)}, close=True))
                    await writer.drain()
                    return
                url = urlsplit(target)
                close = (headers.get("connection", "").lower() == "close"
                         or version.strip() == "HTTP/1.0")
                try:
                    answer = await handler(method, url.path, parse_qs(url.query), body)
                except HttpError as exc:
                    answer = Reply(exc.status, {"error": exc.message})
                except Exception as exc:  # a bug answers 500, and the server goes on
                    log.exception("%s %s failed", method, url.path)
                    answer = Reply(500, {"error": f"{type(exc).__name__}: {exc}"})
                writer.write(_encode(answer.status, answer.body, close=close))
                await writer.drain()
                if close:
                    return
        except (OSError, TimeoutError, asyncio.IncompleteReadError, ConnectionError):
            return
        except asyncio.CancelledError:  # the server shuts down: the connection just ends
            return
        finally:
            writer.close()

    return await asyncio.start_server(connection, host, port, limit=MAX_HEAD)
