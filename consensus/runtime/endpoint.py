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

With ``--endpoints`` (or ``$SDPAXOS_ENDPOINTS``) and without ``--cluster`` exactly those
endpoints are asked. Otherwise (``--cluster``, or the replicas of ``--config``) they are where
the tool starts: every current member is asked, one row each, as the log has the member list
(``consensus.runtime.members``: the newest answer among them, the highest epoch, then the
furthest applied), so a member removed is not asked and one added is, whatever the cluster
file still says. An unreachable replica is a row saying so, and so is a member nobody knows
the address of.

Exit codes (``consensus.runtime.exit_codes``): 0 every replica answered (``health``: and is
ready); 2 usage; 3 a replica unreachable (``health``: or not ready).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from dataclasses import dataclass, field
from typing import Any

from consensus.errors import ConfigError, DecodeError
from consensus.runtime.client_options import NativeTarget, add_client_options, native_target
from consensus.runtime.exit_codes import OK, UNAVAILABLE, USAGE
from consensus.runtime.members import address_text, members_of_status

__all__ = ["add_endpoint_arguments", "run_endpoint"]

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
                        help="report every current member of the cluster, as the log has "
                        "them (what --config does without it), not only the --endpoints")


@dataclass(slots=True)
class Row:
    """One replica's answer, or why there is none."""

    endpoint: str
    status: dict[str, Any] = field(default_factory=dict)
    error: str = ""

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
        return OK if all(not row.error for row in rows) else UNAVAILABLE
    _print_health(rows, as_json=args.json)
    return OK if all(row.healthy for row in rows) else UNAVAILABLE


def _row(address: tuple[str, int], answer: dict[str, Any] | BaseException) -> Row:
    row = Row(address_text(address))
    if isinstance(answer, dict):
        row.status = answer
    elif isinstance(answer, OSError | TimeoutError | ConnectionError):
        row.error = f"unreachable: {str(answer) or type(answer).__name__}"
    else:
        row.error = f"refused: {answer}"
    return row


async def _ask(target: NativeTarget, cluster: bool, timeout_s: float) -> list[Row]:
    from consensus.runtime.client import newest_status, statuses

    answers = await statuses(target.addresses, tls=target.tls, timeout_s=timeout_s)
    seeds = [_row(address, answer) for address, answer in answers.items()]
    if target.explicit and not cluster:
        return seeds
    status = newest_status(answers.values())
    if status is None:  # nobody answered: the seeds, each saying why
        return seeds
    try:
        members = _members(status)
    except DecodeError as exc:  # a peer never crashes the tool
        return [Row(address_text(target.addresses[0]), error=f"refused: {exc}")]
    missing = [address for _, address in members
               if address is not None and address not in answers]
    answers.update(await statuses(missing, tls=target.tls, timeout_s=timeout_s))
    return [_row(address, answers[address]) if address is not None
            else Row("?", error=f"member {member_id}: no address known (it published none "
                     "and the answering replica's cluster file has no entry for it)")
            for member_id, address in members]


def _members(status: dict[str, Any]) -> list[tuple[int, tuple[str, int] | None]]:
    """(id, client address) of every current member a status answer lists: the log's, or
    the cluster file's replicas of a core without membership."""
    from consensus.runtime.client_options import parse_endpoint

    known = members_of_status(status)
    if known is not None:
        return [(m.id, m.info.client_address if m.info else None) for m in known]
    try:
        return [(int(m[0]), parse_endpoint(str(m[2]))) for m in status.get("members", [])]
    except (argparse.ArgumentTypeError, IndexError, TypeError, ValueError) as exc:
        raise DecodeError(f"a replica listed malformed members: {exc}") from None


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
        table.append([str(s.get("id")), str(s.get("site")), str(s.get("address")), str(role),
                      str(s.get("view")), str(s.get("applied")), str(s.get("lag")),
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
    from rich.table import Table

    table = Table(title=title, box=box.SIMPLE_HEAD)
    for column in columns:
        table.add_column(column)
    for row in rows:
        table.add_row(*row)
    Console(width=None if sys.stdout.isatty() else _PIPE_WIDTH).print(table)
