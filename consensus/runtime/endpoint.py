"""``sdpaxos endpoint status | health [--cluster]``: what each replica says about itself.

Each endpoint is asked over its client port (the ``"status"`` request, answered by the replica
from ``consensus.runtime.status``), not over the metrics port's ``/readyz``: every replica has
a client port (a metrics address is optional), the client tools already hold a TLS cluster's
certificates for it, and one answer carries both the status and the readiness verdict that
``/readyz`` gives (the same judgement, ``consensus.runtime.health``).

``status`` shows, per replica: id, site, address, role (sequencer / leader, follower, or
``peer`` for a leaderless protocol), view, applied position, lag behind the best position a
peer reported, bytes of write-ahead log and snapshots on disk, version. ``health`` shows
whether each is healthy (reachable and ready) and, if not, why.

Without ``--cluster`` the endpoints given (``--endpoints``, else every replica of
``--config``; ``consensus.runtime.client_options``) are asked. With ``--cluster`` the member
list comes from the first of them that answers (else from the cluster file) and every member
is asked. An unreachable replica is a row saying so.

Exit codes (``consensus.runtime.exit_codes``): 0 every replica answered (``health``: and is
ready); 1 a replica refused this client (its TLS certificate: ``TlsRefused``, or revoked);
2 usage; 3 a replica unreachable (``health``: or not ready). Views show as ``epoch.view``.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from consensus.errors import (
    ConfigError,
    DecodeError,
    DefiniteFailure,
    SDPaxosError,
    Unreachable,
)
from consensus.protocol.membership import view_text
from consensus.runtime.client_options import (
    NativeTarget,
    add_client_options,
    native_target,
    refused,
)
from consensus.runtime.exit_codes import OK, REFUSED, UNAVAILABLE, USAGE

__all__ = ["add_endpoint_arguments", "run_endpoint"]

#: the client id of the status tool (a status request opens no session)
STATUS_CLIENT_ID = 1 << 44
#: binary prefixes of the sizes in the table
_UNITS = ("B", "K", "M", "G", "T")
_UNIT_STEP = 1024
#: the table's width when stdout is no terminal (rich would wrap it at 80 columns)
_PIPE_WIDTH = 160


def add_endpoint_arguments(parser: argparse.ArgumentParser) -> None:
    _shared(parser, after_verb=False)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    for name, help_text in (
        ("status", "each replica's role, view, applied position, lag, disk use, version"),
        ("health", "whether each replica is reachable and ready (exit 3 if one is not)"),
    ):
        _shared(actions.add_parser(name, help=help_text, description=help_text),
                after_verb=True)


def _shared(parser: argparse.ArgumentParser, *, after_verb: bool) -> None:
    add_client_options(parser, after_verb=after_verb)
    parser.add_argument("--cluster", action="store_true",
                        default=argparse.SUPPRESS if after_verb else False,
                        help="report every member of the cluster, learnt from the first "
                        "endpoint that answers (else from the cluster file)")


@dataclass(slots=True)
class Row:
    """One replica's answer, or why there is none."""

    endpoint: str
    status: dict[str, Any] = field(default_factory=dict)
    error: str = ""
    #: the error is a definite refusal (TLS: this client's certificate, or the replica's),
    #: not an endpoint out of reach
    refused: bool = False

    @property
    def healthy(self) -> bool:
        return not self.error and bool(self.status.get("ready"))


def run_endpoint(args: argparse.Namespace) -> int:
    try:
        target = native_target(args)
    except ConfigError as exc:
        print(f"sdpaxos endpoint: {exc}", file=sys.stderr)
        return USAGE
    rows = asyncio.run(_ask(target, args.cluster, args.timeout))
    if args.action == "status":
        _print_status(rows, as_json=args.json)
        failed = not all(not row.error for row in rows)
    else:
        _print_health(rows, as_json=args.json)
        failed = not all(row.healthy for row in rows)
    if not failed:
        return OK
    return REFUSED if any(row.refused for row in rows) else UNAVAILABLE


def _text(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


async def _status_of(address: tuple[str, int], target: NativeTarget, timeout_s: float) -> Row:
    from consensus.runtime.client import Client

    row = Row(_text(address))
    try:
        async with Client(STATUS_CLIENT_ID, [address], timeout_s=timeout_s, attempts=1,
                          tls=target.tls) as client:
            async with asyncio.timeout(timeout_s):  # connecting included
                row.status = await client.status()
    except (OSError, TimeoutError, ConnectionError) as exc:
        row.error = f"unreachable: {str(exc) or type(exc).__name__}"
    except (SDPaxosError, DecodeError) as exc:
        row.error = refused(exc)
        row.refused = isinstance(exc, DefiniteFailure) and not isinstance(exc, Unreachable)
    return row


async def _ask(target: NativeTarget, cluster: bool, timeout_s: float) -> list[Row]:
    if not cluster:
        return list(await asyncio.gather(
            *(_status_of(address, target, timeout_s) for address in target.addresses)))
    known: dict[str, Row] = {}
    members: list[tuple[str, int]] | None = None
    for address in target.addresses:  # the member list from the first that answers
        row = await _status_of(address, target, timeout_s)
        known[row.endpoint] = row
        if not row.error:
            try:
                members = [_member_address(m) for m in row.status.get("members", [])]
            except DecodeError as exc:  # a peer never crashes the tool
                row.error = refused(exc)
                continue
            break
    if members is None and target.config is not None:
        members = [spec.client_address for spec in target.config.replicas]
    if members is None:  # nobody answered and no file lists the members
        return list(known.values())
    missing = [a for a in members if _text(a) not in known]
    asked = await asyncio.gather(*(_status_of(a, target, timeout_s) for a in missing))
    known.update((row.endpoint, row) for row in asked)
    return [known[_text(a)] for a in members]


def _member_address(member: Any) -> tuple[str, int]:
    """A status answer's ``[id, site, "host:port"]`` member as an address."""
    from consensus.runtime.client_options import parse_endpoint

    try:
        return parse_endpoint(str(member[2]))
    except (argparse.ArgumentTypeError, IndexError, TypeError) as exc:
        raise DecodeError(f"a replica listed a malformed member {member!r}: {exc}") from None


def _size(count: object) -> str:
    if not isinstance(count, int):
        return "?"
    value = float(count)
    for unit in _UNITS:
        if value < _UNIT_STEP or unit == _UNITS[-1]:
            return f"{value:.0f}{unit}" if unit == "B" else f"{value:.1f}{unit}"
        value /= _UNIT_STEP
    raise AssertionError("unreachable")


def _print_status(rows: list[Row], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps([{"endpoint": r.endpoint, "reachable": not r.error,
                           **({"error": r.error} if r.error else r.status)} for r in rows]))
        return
    columns = ["id", "site", "address", "role", "view", "applied", "lag", "WAL", "snapshots",
               "version"]
    table = []
    for row in rows:
        s = row.status
        if row.error:
            table.append(["?", "?", row.endpoint, row.error, "", "", "", "", "", ""])
            continue
        role = s.get("role", "?")
        view = s.get("view")
        table.append([str(s.get("id")), str(s.get("site")), str(s.get("address")), str(role),
                      view_text(view) if isinstance(view, int) else "?",
                      str(s.get("applied")), str(s.get("lag")),
                      _size(s.get("wal_bytes")), _size(s.get("snapshot_bytes")),
                      str(s.get("version"))])
    _table(f"{len(rows)} endpoint(s)", columns, table)


def _print_health(rows: list[Row], *, as_json: bool) -> None:
    if as_json:
        print(json.dumps([{"endpoint": r.endpoint, "id": r.status.get("id"),
                           "healthy": r.healthy,
                           "reasons": [r.error] if r.error else r.status.get("reasons", [])}
                          for r in rows]))
        return
    table = [[row.endpoint, str(row.status.get("id", "?")),
              "healthy" if row.healthy else "UNHEALTHY",
              row.error or "; ".join(row.status.get("reasons", []))] for row in rows]
    healthy = sum(row.healthy for row in rows)
    _table(f"{healthy} of {len(rows)} endpoint(s) healthy", ["endpoint", "id", "health",
                                                             "detail"], table)


def _table(title: str, columns: list[str], rows: list[list[str]]) -> None:
    from rich import box
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD)
    for column in columns:
        table.add_column(column)
    for row in rows:  # what replicas say is text, not markup ("[tls]" stays)
        table.add_row(*(escape(cell) for cell in row))
    Console(width=None if sys.stdout.isatty() else _PIPE_WIDTH).print(table)
