"""Liveness and readiness of one replica: ``GET /livez`` and ``GET /readyz`` on its metrics port.

**Liveness** (``/livez``) says only that the process runs: its event loop answers and the
replica's loop task has not died. It never depends on peers, so a replica cut off in a
minority partition stays live (restarting it would not heal the partition, and restarting
every replica of a partitioned majority at once is how an outage starts).

**Readiness** (``/readyz``) says the replica can serve clients now, from what it knows itself
(its node's loop and peer frames, and its core's ``status()``):

1. *serving*: the log is replayed and the replica's loop runs (not stopping);
2. *voting*: it is a voter of its configuration (a member still learning the log, or one
   removed, is not);
3. *view accepted*: it holds its current view — an SDPaxos follower or sequencer of a view
   whose NewView it accepted, not a candidate or a sequencer still establishing its view; a
   Multi-Paxos leader or follower, not a candidate;
4. *majority heard*: counting itself, a majority of its configuration's voters sent it a
   frame within the last ``heard_window_s`` (by default ``READY_HEARD_TIMEOUTS`` election
   timeouts: heartbeats flow every heartbeat interval, so silence that long means the peer is
   gone or cut off);
5. *caught up*: its applied position is at most ``max_lag`` slots behind the best position a
   peer reported (heartbeats and catch-up requests carry it; a core that knows no comparable
   positions, EPaxos, skips this).

A replica in a minority partition fails (4) and answers 503 while ``/livez`` answers 200.
``Readiness.reasons`` names every failed condition; the 503 body lists them. ``judge`` is the
judgement alone, from a core's status and the node's facts.
"""

from __future__ import annotations

import asyncio
import ssl
import sys
import time
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from consensus.errors import ConfigError
from consensus.protocol.membership import view_text
from consensus.protocol.status import CoreStatus
from consensus.protocol.types import Role

if TYPE_CHECKING:
    from consensus.runtime.node import ReplicaNode

__all__ = [
    "PROBES",
    "READY_HEARD_TIMEOUTS",
    "READY_MAX_LAG",
    "Readiness",
    "http_probe",
    "judge",
    "liveness",
    "readiness",
    "run_probe",
]

#: how many election timeouts of silence make a peer count as not heard from
READY_HEARD_TIMEOUTS = 2
#: how many slots a ready replica may be behind the best position a peer reported
READY_MAX_LAG = 1000
#: the probe paths served beside /metrics
PROBES = ("livez", "readyz")
#: HTTP status codes of a passed and a failed probe
HTTP_OK = 200
HTTP_UNAVAILABLE = 503


@dataclass(frozen=True, slots=True)
class Readiness:
    ready: bool
    reasons: tuple[str, ...]  # the failed conditions; empty when ready


def liveness(node: ReplicaNode) -> Readiness:
    """The process runs: always, unless the replica's loop task died."""
    if node.loop_died:
        return Readiness(False, ("the replica's event loop stopped",))
    return Readiness(True, ())


def readiness(
    node: ReplicaNode, *, now: float | None = None, heard_window_s: float | None = None,
    max_lag: int = READY_MAX_LAG,
) -> Readiness:
    """The conditions of the module documentation, judged now (``time.monotonic()``)."""
    if heard_window_s is None:
        heard_window_s = READY_HEARD_TIMEOUTS * node.config.protocol.election_timeout_us / 1e6
    return judge(
        node.core.status(), me=node.me, serving=node.serving, applied=node.executed_slot,
        heard_at=node.peer_heard_at, now=time.monotonic() if now is None else now,
        heard_window_s=heard_window_s, max_lag=max_lag,
    )


def judge(
    status: CoreStatus, *, me: int, serving: bool, applied: int, heard_at: Mapping[int, float],
    now: float, heard_window_s: float, max_lag: int,
) -> Readiness:
    """Replica ``me``'s readiness: its core's ``status``, whether its loop is ``serving``, the
    slot its state machine ``applied`` up to, and when it last heard from each member
    (``heard_at``, seconds on the clock of ``now``)."""
    reasons: list[str] = []
    if not serving:
        reasons.append("not serving (replaying its log, stopping or stopped)")
    if not status.voting:
        reasons.append("not a voter (a member learning the log, or one removed)")
    if not status.view_accepted or status.role in (Role.CANDIDATE, Role.ESTABLISHING):
        reasons.append(f"view {view_text(status.view)} not accepted yet "
                       f"(role {status.role.value})")
    voters = status.voters
    heard = sum(
        1 for voter in voters
        if voter == me or (voter in heard_at and now - heard_at[voter] <= heard_window_s)
    )
    majority = len(voters) // 2 + 1
    if heard < majority:
        reasons.append(
            f"heard from {heard} of {len(voters)} replicas (itself included) in the last "
            f"{heard_window_s:.3g}s, a majority is {majority}"
        )
    best = status.best_peer_executed
    if best is not None and best - applied > max_lag:
        reasons.append(
            f"applied up to slot {applied}, a peer reported {best} (more than {max_lag} behind)"
        )
    return Readiness(not reasons, tuple(reasons))


def probe_response(node: ReplicaNode, path: str) -> tuple[int, bytes]:
    """(HTTP status, body) for ``/livez`` or ``/readyz``."""
    verdict = liveness(node) if path == "livez" else readiness(node)
    if verdict.ready:
        return HTTP_OK, b"ok\n"
    return HTTP_UNAVAILABLE, ("\n".join(verdict.reasons) + "\n").encode()


async def http_probe(
    host: str, port: int, path: str, timeout_s: float, tls: ssl.SSLContext | None = None
) -> tuple[int, str]:
    """GET ``/path`` from a replica's metrics port (aiohttp): (status, body); status 0 and
    why if it cannot be reached."""
    import aiohttp

    scheme = "https" if tls is not None else "http"
    url = f"{scheme}://{f'[{host}]' if ':' in host else host}:{port}/{path}"
    try:
        async with aiohttp.ClientSession(
            timeout=aiohttp.ClientTimeout(total=timeout_s)
        ) as session, session.get(url, ssl=tls if tls is not None else False) as response:
            return response.status, await response.text(errors="replace")
    except (aiohttp.ClientError, OSError, TimeoutError, ssl.SSLError) as exc:
        return 0, str(exc) or type(exc).__name__


def run_probe(config_path: str, me: int, path: str, timeout_s: float) -> int:
    """``sdpaxos cluster health --probe livez|readyz``: 0 if the probe passes, 1 if not, 2 on
    a bad configuration (a health check command for compose and exec probes)."""
    from consensus.runtime.cluster_config import load_cluster_config

    try:
        config = load_cluster_config(config_path)
        address = config.replica(me).metrics_address
        if address is None:
            raise ConfigError(f"replica {me} has no metrics_address to probe")
        tls = config.tls.tool() if config.tls is not None and config.tls.metrics else None
    except ConfigError as exc:
        print(f"sdpaxos cluster health: {exc}", file=sys.stderr)
        return 2
    status, body = asyncio.run(http_probe(*address, path, timeout_s, tls))
    print(f"replica {me} /{path}: {status or 'unreachable'} {body.strip()}")
    return 0 if status == HTTP_OK else 1
