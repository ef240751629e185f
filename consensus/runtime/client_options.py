"""Where a client verb finds the cluster: the options every client verb shares.

``--endpoints HOST:PORT,...`` names the replicas to talk to (client ports for ``sdpaxos``'s
own verbs, gRPC addresses for ``sdpaxos ctl``); ``--config FILE`` a cluster file whose
replicas are the endpoints (and whose ``[tls]`` table supplies a TLS cluster's certificates).
Without either option, the environment's ``SDPAXOS_ENDPOINTS`` and ``SDPAXOS_CONFIG`` stand in
for them. An option on the command line beats the environment; given both ways, endpoints
choose whom to ask and the cluster file still supplies the certificates.

A verb with actions (``endpoint status``, ``ctl submit``) accepts these options before and
after its action: ``add_client_options`` goes on the verb's parser with real defaults and on
every action's parser with ``after_verb=True`` (argparse.SUPPRESS defaults, so an option not
given after the action does not overwrite one given before it).

An address is ``host:port`` (``[v6]:port``); a missing or bad port is a usage error, never a
default port.

Either way the replicas named are where a verb starts: it asks them for the current members
and talks to those (``Client.sync``, as etcd clients sync their endpoints from
``MemberList``), so a cluster file that still lists a removed member, or lacks one added
later, leads the tools to the members the log has. ``sdpaxos endpoint status|health`` without
``--cluster`` asks exactly the ``--endpoints`` given.
"""

from __future__ import annotations

import argparse
import asyncio
import math
import os
import ssl
import sys
from collections.abc import Coroutine, Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from consensus.auth import PermissionDenied
from consensus.errors import ConfigError, DefiniteFailure, IndefiniteFailure, Unreachable
from consensus.runtime.exit_codes import INTERRUPTED, REFUSED, UNAVAILABLE

if TYPE_CHECKING:
    from consensus.runtime.client import Client
    from consensus.runtime.cluster_config import ClusterConfig

__all__ = [
    "CONFIG_ENV",
    "ENDPOINTS_ENV",
    "ClientTarget",
    "NativeTarget",
    "add_client_options",
    "client_target",
    "native_target",
    "parse_endpoint",
    "parse_endpoints",
    "run_session",
    "tool_client",
]

ENDPOINTS_ENV = "SDPAXOS_ENDPOINTS"
CONFIG_ENV = "SDPAXOS_CONFIG"
#: default seconds a client verb waits for one answer
DEFAULT_TIMEOUT_S = 5.0
#: a client verb tries at least this many replicas (the members it learns may outnumber the
#: endpoints it was given)
MIN_ATTEMPTS = 3
_PORT_RANGE = range(1, 1 << 16)


def parse_endpoint(text: str) -> tuple[str, int]:
    """``"host:port"`` -> ``("host", port)``; ``"[::1]:7100"`` -> ``("::1", 7100)``."""
    host, sep, port = text.strip().rpartition(":")
    if host.startswith("[") and host.endswith("]"):
        host = host[1:-1]
    if not sep or not host or not port.isdigit() or int(port) not in _PORT_RANGE:
        raise argparse.ArgumentTypeError(
            f"expected HOST:PORT with a port in 1..65535, got {text!r}")
    return host, int(port)


def parse_endpoints(text: str) -> tuple[tuple[str, int], ...]:
    """``"a:1,b:2"`` -> ``(("a", 1), ("b", 2))``."""
    parts = [part for part in text.split(",") if part.strip()]
    if not parts:
        raise argparse.ArgumentTypeError("expected HOST:PORT[,HOST:PORT...], got nothing")
    return tuple(parse_endpoint(part) for part in parts)


def add_client_options(
    parser: argparse.ArgumentParser | argparse._ArgumentGroup, *, after_verb: bool = False,
    endpoints_are: str = "client ports", timeout_s: float = DEFAULT_TIMEOUT_S,
    json_output: bool = True,
) -> None:
    """``--endpoints``, ``--config``, ``--timeout`` and (``json_output``) ``--json`` (see the
    module)."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if after_verb else value

    parser.add_argument(
        "--endpoints", type=parse_endpoints, default=default(None), metavar="HOST:PORT,...",
        help=f"the replicas' {endpoints_are}, comma-separated (default: ${ENDPOINTS_ENV}, "
        "else every replica of --config)")
    parser.add_argument(
        "--config", default=default(None), metavar="FILE",
        help=f"the cluster file: its replicas and [tls] certificates (default: ${CONFIG_ENV})")
    parser.add_argument("--timeout", type=float, default=default(timeout_s), metavar="SECONDS",
                        help=f"seconds to wait for each answer (default: {timeout_s:g})")
    if json_output:
        parser.add_argument("--json", action="store_true", default=default(False),
                            help="print JSON instead of a table")


@dataclass(frozen=True, slots=True)
class ClientTarget:
    """Whom a client verb asks: explicit endpoints, or (``None``) the cluster file's
    replicas; and the cluster file (for its replicas or its certificates), if any."""

    endpoints: tuple[tuple[str, int], ...] | None
    config_path: str | None


def client_target(args: argparse.Namespace, environ: Mapping[str, str] | None = None
                  ) -> ClientTarget:
    """The endpoints and cluster file from ``args`` and the environment (see the module);
    ``ConfigError`` saying what to give when there is neither."""
    env = os.environ if environ is None else environ
    endpoints: tuple[tuple[str, int], ...] | None = getattr(args, "endpoints", None)
    config: str | None = getattr(args, "config", None)
    if endpoints is None and config is None:
        text = env.get(ENDPOINTS_ENV, "").strip()
        if text:
            try:
                endpoints = parse_endpoints(text)
            except argparse.ArgumentTypeError as exc:
                raise ConfigError(f"${ENDPOINTS_ENV}: {exc}") from None
    if config is None:
        config = env.get(CONFIG_ENV, "").strip() or None
    if endpoints is None and config is None:
        raise ConfigError(f"no endpoints: give --endpoints or --config (or set "
                          f"${ENDPOINTS_ENV} or ${CONFIG_ENV})")
    return ClientTarget(endpoints, config)


@dataclass(frozen=True, slots=True)
class NativeTarget:
    """What a native client (``consensus.runtime.client``) needs: the client ports to ask, in
    order, the TLS context of a TLS cluster, and the cluster file when one was given."""

    addresses: list[tuple[str, int]]
    tls: ssl.SSLContext | None
    config: ClusterConfig | None
    #: the addresses were given (``--endpoints`` or ``$SDPAXOS_ENDPOINTS``), not taken from
    #: the cluster file's replicas
    explicit: bool = False


def native_target(args: argparse.Namespace, environ: Mapping[str, str] | None = None
                  ) -> NativeTarget:
    """``client_target`` resolved for the native client port (``ConfigError`` if the cluster
    file is unreadable or bad)."""
    from consensus.runtime.cluster_config import load_cluster_config

    target = client_target(args, environ)
    config = load_cluster_config(target.config_path) if target.config_path else None
    tls = config.tls.tool() if config is not None and config.tls is not None else None
    if target.endpoints is not None:
        addresses = list(target.endpoints)
    else:
        assert config is not None  # client_target gives one or the other
        addresses = [spec.client_address for spec in config.replicas]
    return NativeTarget(addresses, tls, config, explicit=target.endpoints is not None)


def tool_client(target: NativeTarget, client_id: int, timeout_s: float) -> Client:
    """A client verb's client: it starts at the target's replicas and follows the current
    members from its first request on (``Client.sync``)."""
    from consensus.runtime.client import Client

    return Client(client_id, target.addresses, timeout_s=timeout_s,
                  attempts=max(MIN_ATTEMPTS, len(target.addresses)), tls=target.tls,
                  sync_every_s=math.inf)


def run_session(verb: str, session: Coroutine[Any, Any, int]) -> int:
    """Run a client verb's session; what it raised becomes its exit code
    (``consensus.runtime.exit_codes``), said on stderr."""
    try:
        return asyncio.run(session)
    except PermissionDenied as exc:
        print(f"sdpaxos {verb}: denied: {exc}", file=sys.stderr)
        return REFUSED
    except Unreachable as exc:  # never sent: "unavailable", as the exit codes name it
        print(f"sdpaxos {verb}: unavailable: {exc}", file=sys.stderr)
        return UNAVAILABLE
    except DefiniteFailure as exc:
        print(f"sdpaxos {verb}: refused: {exc}", file=sys.stderr)
        return REFUSED
    except (IndefiniteFailure, OSError, TimeoutError) as exc:
        print(f"sdpaxos {verb}: unavailable: {exc}", file=sys.stderr)
        return UNAVAILABLE
    except KeyboardInterrupt:
        return INTERRUPTED
