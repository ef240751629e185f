"""Just enough HTTP/1.1 on asyncio for the extender and the Kubernetes API (no dependency).

``serve(handler, host, port)`` answers requests on keep-alive connections: ``handler(method,
path, query, body)`` returns ``Reply(status, json_body)`` or ``Stream(async_iterator)`` (a
chunked stream of JSON lines: the API server's watch). A request it cannot parse gets 400 and
the connection is closed; a handler that raises gets 500 with the error's text; a peer never
crashes the server.

``request(...)`` is the client half: one request on a fresh connection (optionally TLS with a
bearer token: the in-cluster service account), the JSON reply; ``stream(...)`` yields the JSON
lines of a chunked watch.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import ssl
from collections.abc import AsyncIterator, Awaitable, Callable
from dataclasses import dataclass
from typing import Any
from urllib.parse import parse_qs, urlsplit

__all__ = ["HttpError", "Reply", "Stream", "request", "serve", "stream"]

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


@dataclass(frozen=True, slots=True)
class Stream:
    events: AsyncIterator[Any]


Handler = Callable[[str, str, dict[str, list[str]], Any], Awaitable[Reply | Stream]]


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
                        raw = await _read_body(reader, headers)
                    body = json.loads(raw) if raw else None
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
                if isinstance(answer, Stream):
                    await _write_stream(writer, answer)
                    return
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


async def _write_stream(writer: asyncio.StreamWriter, answer: Stream) -> None:
    writer.write(b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                 b"Transfer-Encoding: chunked\r\n\r\n")
    async for event in answer.events:
        line = json.dumps(event).encode() + b"\n"
        writer.write(f"{len(line):x}\r\n".encode() + line + b"\r\n")
        await writer.drain()
    writer.write(b"0\r\n\r\n")
    await writer.drain()


async def _open(url: str, tls: ssl.SSLContext | None) -> tuple[
        asyncio.StreamReader, asyncio.StreamWriter, str]:
    parts = urlsplit(url)
    https = parts.scheme == "https"
    host = parts.hostname or "localhost"
    port = parts.port or (443 if https else 80)
    context = (tls or ssl.create_default_context()) if https else None
    reader, writer = await asyncio.open_connection(
        host, port, ssl=context, server_hostname=host if context else None, limit=MAX_HEAD)
    return reader, writer, host


def _request_bytes(method: str, host: str, path: str, body: Any, token: str) -> bytes:
    data = b"" if body is None else json.dumps(body).encode()
    head = [f"{method} {path} HTTP/1.1", f"Host: {host}", "Accept: application/json",
            "Connection: close", f"Content-Length: {len(data)}"]
    if data:
        head.append("Content-Type: application/json")
    if token:
        head.append(f"Authorization: Bearer {token}")
    return ("\r\n".join(head) + "\r\n\r\n").encode() + data


async def request(
    base: str, method: str, path: str, body: Any = None, *, token: str = "",
    tls: ssl.SSLContext | None = None, timeout_s: float = 10.0,
) -> tuple[int, Any]:
    """One request to ``base`` (``http[s]://host:port``): (status, decoded JSON body)."""
    async with asyncio.timeout(timeout_s):
        reader, writer, host = await _open(base, tls)
        try:
            writer.write(_request_bytes(method, host, path, body, token))
            await writer.drain()
            lines = await _read_head(reader)
            if lines is None:
                raise HttpError(502, "the server closed the connection")
            status = int(lines[0].split(b" ", 2)[1])
            headers = _headers(lines[1:])
            if "content-length" in headers or "transfer-encoding" in headers:
                raw = await _read_body(reader, headers)
            else:
                raw = await reader.read()
        finally:
            writer.close()
    try:
        return status, json.loads(raw) if raw else None
    except ValueError:
        return status, {"error": raw.decode(errors="replace")}


async def stream(
    base: str, path: str, *, token: str = "", tls: ssl.SSLContext | None = None,
    connect_timeout_s: float = 10.0,
) -> AsyncIterator[Any]:
    """The JSON lines of a chunked GET (a Kubernetes watch), as they come."""
    async with asyncio.timeout(connect_timeout_s):
        reader, writer, host = await _open(base, tls)
        writer.write(_request_bytes("GET", host, path, None, token))
        await writer.drain()
        lines = await _read_head(reader)
    try:
        if lines is None:
            raise HttpError(502, "the server closed the connection")
        status = int(lines[0].split(b" ", 2)[1])
        if status != 200:
            raise HttpError(status, f"watch {path} refused")
        buffer = b""
        while True:
            size_line = await reader.readuntil(b"\r\n")
            size = int(size_line.split(b";")[0], 16)
            if size == 0:
                return
            buffer += (await reader.readexactly(size + 2))[:-2]
            while b"\n" in buffer:
                line, buffer = buffer.split(b"\n", 1)
                if line.strip():
                    yield json.loads(line)
    finally:
        writer.close()
        with contextlib.suppress(OSError, ConnectionError):
            await writer.wait_closed()
