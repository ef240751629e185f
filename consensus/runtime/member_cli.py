"""``sdpaxos member list | add | promote | remove | replace``: the live member set (the log's,
``consensus.protocol.membership``), over the native client port.

    sdpaxos member list                      id, incarnation, voter/learner, sequencer, site,
                                             every address, applied position and lag (--json)
    sdpaxos member add --site S [--id N] [--address H:P] [--client-address H:P]
                       [--grpc-address H:P] [--metrics-address H:P]
                                             a new learner, a whole replica: its addresses
                                             (assigned unless given), its cluster-file entry
                                             and the command that starts it (it is promoted
                                             once caught up)
    sdpaxos member promote ID                make a caught-up learner a voter now
    sdpaxos member remove ID                 a voter (the sequencer too: the next one takes
                                             over) or a learner; the removed replica stops
                                             (``serve`` exits 4) and never starts again
    sdpaxos member replace OLD --site S ...  a learner that takes OLD's place when promoted
                                             (a replica that lost its disk: a new id)

``add`` and ``replace`` assign each address not given the way ``cluster init`` laid the
members out: when every current member that has that kind of address has it on one host at
``base + id`` (``cluster init``: peers at base+id, clients +100, metrics +200, gRPC +300), the
new member gets ``base + its id`` there (ids are never reused, so neither are these ports); a
kind no member has (gRPC on a cluster without it) is left out; otherwise the flag is needed.
The new member's id is the next free one (the log's ``next_id``) unless ``--id`` names one.

The cluster file seeds the cluster; the member set and every member's addresses are the
log's. The entry ``add`` prints goes in the new replica's copy of the file (and may go in
the others': the tools learn the members from the log either way), and a removed member's
entry may be deleted. Where the cluster is: ``--endpoints`` / ``--config`` or
``$SDPAXOS_ENDPOINTS`` / ``$SDPAXOS_CONFIG`` (where the tool starts: it follows the current
members). Exit codes (``consensus.runtime.exit_codes``): 0 done; 1 refused (one change at a
time, no such member, the last voter, ids are never reused, denied); 2 usage (an address to
give, or used by a member already); 3 unavailable.
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path
from typing import Any

from consensus.errors import ConfigError, DecodeError, IndefiniteFailure
from consensus.protocol.membership.config import (
    ADD,
    NO_MEMBER,
    PROMOTE,
    REMOVE,
    REPLACE,
    Change,
)
from consensus.runtime.client import new_client_id
from consensus.runtime.client_options import (
    NativeTarget,
    add_client_options,
    native_target,
    run_session,
    tool_client,
)
from consensus.runtime.cluster_config import parse_address
from consensus.runtime.exit_codes import OK, REFUSED, USAGE
from consensus.runtime.members import KnownMember, MemberInfo, address_text, members_of_status

__all__ = ["add_member_arguments", "assign_addresses", "run_member"]

#: the kinds of address a member has: (MemberInfo field, flag, what it is)
ADDRESS_KINDS = (
    ("address", "--address", "peer address"),
    ("client_address", "--client-address", "client address"),
    ("grpc_address", "--grpc-address", "gRPC address (what the state machine serves)"),
    ("metrics_address", "--metrics-address", "metrics and health address (/readyz)"),
)
#: the kinds every member has
REQUIRED_KINDS = ("address", "client_address")


def _address(text: str) -> tuple[str, int]:
    try:
        return parse_address(text, "address")
    except ConfigError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def add_member_arguments(parser: argparse.ArgumentParser) -> None:
    add_client_options(parser)
    actions = parser.add_subparsers(dest="action", required=True, metavar="ACTION")
    listing = actions.add_parser("list", help="the live members, as the log has them")
    add_client_options(listing, after_verb=True)
    for name, help_text in ((ADD, "add a new member (a learner until it caught up)"),
                            (REPLACE, "add a learner that takes a voter's place once promoted")):
        sub = actions.add_parser(name, help=help_text)
        add_client_options(sub, after_verb=True)
        if name == REPLACE:
            sub.add_argument("old", type=int, help="the voter to replace (its id)")
        for field, flag, what in ADDRESS_KINDS:
            sub.add_argument(flag, dest=field, type=_address, default=None, metavar="HOST:PORT",
                             help=f"the new member's {what} (default: assigned, see "
                             "sdpaxos member --help)")
        sub.add_argument("--site", required=True, help="where it runs (a region name)")
        sub.add_argument("--id", type=int, default=NO_MEMBER,
                         help="the id wanted (default: the next free one; ids are never reused)")
    for name, help_text in ((PROMOTE, "make a learner a voter now"),
                            (REMOVE, "remove a voter or a learner")):
        sub = actions.add_parser(name, help=help_text)
        add_client_options(sub, after_verb=True)
        sub.add_argument("member", type=int, help="the member's id")


def run_member(args: argparse.Namespace) -> int:
    try:
        target = native_target(args)
    except ConfigError as exc:
        print(f"sdpaxos member {args.action}: {exc}", file=sys.stderr)
        return USAGE

    async def session() -> int:
        status, answers = await _current(target, args.timeout)
        if args.action == "list":
            return _show(args, status, answers)
        change, new = _change_of(args, status)
        async with tool_client(target, new_client_id(), args.timeout) as client:
            answer = await client.change_members(change)
        return _report(args, target, answer, new)

    try:
        return run_session(f"member {args.action}", session())
    except _Usage as exc:
        print(f"sdpaxos member {args.action}: {exc}", file=sys.stderr)
        return USAGE


class _Usage(Exception):
    """What the command line must say that the cluster cannot tell (an address to give)."""


async def _current(target: NativeTarget,
                   timeout_s: float) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """The status furthest along (epoch, then applied position) among the replicas the tool
    starts from, and the status of every current member that answers, by id."""
    from consensus.runtime.client import newest_status, statuses

    answers = await statuses(target.addresses, tls=target.tls, timeout_s=timeout_s)
    status = newest_status(answers.values())
    if status is None:
        raise IndefiniteFailure("no replica answered: "
                                + "; ".join(f"{address_text(a)}: {e}" for a, e in answers.items()))
    try:
        members = members_of_status(status) or []
    except DecodeError as exc:  # a peer never crashes the tool
        raise IndefiniteFailure(str(exc)) from None
    missing = [m.info.client_address for m in members
               if m.info is not None and m.info.client_address not in answers]
    answers.update(await statuses(missing, tls=target.tls, timeout_s=timeout_s))
    by_id = {int(a["id"]): a for a in answers.values()
             if isinstance(a, dict) and type(a.get("id")) is int}
    return status, by_id


def _change_of(args: argparse.Namespace,
               status: dict[str, Any]) -> tuple[Change, tuple[int, MemberInfo] | None]:
    """The change the command line asks for, and (add, replace) the new member's id and
    addresses."""
    if args.action not in (ADD, REPLACE):
        return Change(args.action, member=args.member), None
    membership = status.get("membership")
    if membership is None:
        raise _Usage("this cluster's protocol has no membership changes")
    new_id = args.id
    if new_id == NO_MEMBER:
        new_id = membership.get("next_id")
        if type(new_id) is not int:
            raise _Usage("the replica does not say which id is next: give --id")
    given = {field: getattr(args, field) for field, _, _ in ADDRESS_KINDS}
    try:
        info = assign_addresses(members_of_status(status) or [], new_id, args.site, given)
    except ConfigError as exc:
        raise _Usage(str(exc)) from None
    change = Change(args.action, member=new_id,
                    replaces=args.old if args.action == REPLACE else NO_MEMBER,
                    info=info.encode())
    return change, (new_id, info)


def assign_addresses(members: list[KnownMember], new_id: int, site: str,
                     given: dict[str, tuple[str, int] | None]) -> MemberInfo:
    """The new member's addresses: the ones ``given``, the others assigned as the module
    says (``ConfigError`` naming the flag to give, or an address a member has already)."""
    taken = {address for m in members if m.info is not None
             for address in (m.info.address, m.info.client_address, m.info.grpc_address,
                             m.info.metrics_address) if address is not None}
    chosen: dict[str, tuple[str, int]] = {}
    for field, flag, what in ADDRESS_KINDS:
        address = given.get(field)
        if address is None:
            placed = [(m.id, getattr(m.info, field)) for m in members
                      if m.info is not None and getattr(m.info, field) is not None]
            if not placed and field not in REQUIRED_KINDS:
                continue  # no member has one (no gRPC service, say): neither does this one
            hosts = {host for _, (host, _) in placed}
            ports = {port - member_id + new_id for member_id, (_, port) in placed}
            if len(hosts) != 1 or len(ports) != 1 or not 0 < min(ports) < 65536:
                laid_out = ", ".join(f"{i}: {address_text(a)}" for i, a in placed) or "none"
                raise ConfigError(f"cannot assign the new member's {what}: the members' "
                                  f"({laid_out}) are not on one host at base + id; give {flag}")
            address = (hosts.pop(), ports.pop())
        if address in taken or address in chosen.values():
            raise ConfigError(f"{flag} {address_text(address)} is a current member's address "
                              "already")
        chosen[field] = address
    return MemberInfo(chosen["address"], chosen["client_address"], site,
                      chosen.get("grpc_address"), chosen.get("metrics_address"))


def _entry(new_id: int, info: MemberInfo, tls: bool) -> str:
    """The new member's ``[[replica]]`` entry in the cluster file."""
    lines = ["[[replica]]", f"id = {new_id}"]
    for field, _, _ in ADDRESS_KINDS:
        address = getattr(info, field)
        if address is not None:
            lines.append(f'{field} = "{address_text(address)}"')
    lines.append(f"site = {json.dumps(info.site)}")
    if tls:  # (where cluster init puts a replica's certificate)
        lines += [f'tls_cert = "tls/replica-{new_id}.pem"', f'tls_key = "tls/replica-{new_id}.key"']
    lines.append("joined = true")
    return "\n".join(lines)


def _report(args: argparse.Namespace, target: NativeTarget, answer: str,
            new: tuple[int, MemberInfo] | None) -> int:
    refused = answer.startswith("refused")
    doc: dict[str, Any] = {"ok": not refused, "answer": answer}
    if new is not None and not refused:
        new_id, info = new
        config = str(Path(args.config).resolve()) if getattr(args, "config", None) else "FILE"
        doc.update(id=new_id, entry=_entry(new_id, info, target.config is not None
                                           and target.config.tls is not None),
                   start=f"sdpaxos serve --config {config} --id {new_id} "
                   "--initial-cluster-state new")
    if args.json:
        print(json.dumps(doc))
    else:
        print(answer)
        if "entry" in doc:
            print("\nIts entry in the cluster file (the new replica's copy needs it; the "
                  "tools follow the log's members either way):\n"
                  f"{doc['entry']}\n\nthen start it with an empty data directory:\n"
                  f"{doc['start']}")
    return REFUSED if refused else OK


def _show(args: argparse.Namespace, status: dict[str, Any],
          others: dict[int, dict[str, Any]]) -> int:
    membership = status.get("membership")
    if membership is None:
        print("sdpaxos member list: this cluster's protocol has no membership changes "
              "(its members are the cluster file's)", file=sys.stderr)
        return USAGE
    rows = []
    front = max([a["applied"] for a in others.values()] + [status["applied"]])
    for member in members_of_status(status) or []:
        seen = others.get(member.id)  # (a member that does not answer: unknown)
        row = member.to_status()
        row.update(role="voter" if member.voter else "learner",
                   sequencer=member.id == membership["sequencer"],
                   applied=None if seen is None else seen["applied"],
                   lag=None if seen is None else front - seen["applied"])
        rows.append(row)
    doc = {"source": "the log (the cluster file seeds the cluster)",
           "epoch": membership["epoch"], "closing": membership["closing"] or None,
           "next_id": membership.get("next_id"), "applied": status["applied"],
           "lag": status["lag"], "members": rows}
    if args.json:
        print(json.dumps(doc))
        return OK
    print(f"members of epoch {doc['epoch']} (from the log), as replica {status['id']} knows "
          f"them at applied position {status['applied']}, lag {status['lag']}"
          + (f"; closing: {membership['closing']} {membership['closing_member']}"
             if membership["closing"] else ""))
    print(f"{'ID':>4}  {'INC':>3}  {'ROLE':<7}  {'SEQ':<3}  {'SITE':<6}  {'ADDRESS':<21}  "
          f"{'CLIENT':<21}  {'GRPC':<21}  {'METRICS':<21}  {'APPLIED':>8}  {'LAG':>6}")
    for row in rows:
        applied = "?" if row["applied"] is None else row["applied"]
        lag = "?" if row["lag"] is None else row["lag"]
        print(f"{row['id']:>4}  {row['incarnation']:>3}  {row['role']:<7}  "
              f"{'*' if row['sequencer'] else '':<3}  {row['site']:<6}  "
              f"{row['address'] or '?':<21}  {row['client_address'] or '?':<21}  "
              f"{row['grpc_address'] or '-':<21}  {row['metrics_address'] or '-':<21}  "
              f"{applied:>8}  {lag:>6}")
    return OK
