"""The tests' HTTP client for the extender's endpoints (what kube-scheduler would send), on
aiohttp (installed with the ``k8s`` extra, which ``kubernetes_asyncio`` needs)."""

from __future__ import annotations

import json
from typing import Any

import aiohttp


async def request(base: str, method: str, path: str, body: Any = None, *,
                  timeout_s: float = 10.0) -> tuple[int, Any]:
    """One request to ``base``: (status, decoded JSON body). A server that cannot be reached
    or drops the connection raises ``ConnectionError`` (an ``OSError``), a slow one
    ``TimeoutError``."""
    timeout = aiohttp.ClientTimeout(total=timeout_s)
    try:
        async with aiohttp.ClientSession(timeout=timeout) as session, session.request(
                method, base.rstrip("/") + path,
                data=None if body is None else json.dumps(body),
                headers={"Content-Type": "application/json"}) as response:
            raw = await response.read()
    except aiohttp.ClientError as exc:
        raise ConnectionError(f"{method} {base}{path}: {exc}") from exc
    try:
        return response.status, json.loads(raw) if raw else None
    except ValueError:
        return response.status, {"error": raw.decode(errors="replace")}
