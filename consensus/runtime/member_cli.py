"""``sdpaxos member list | add | promote | remove | replace``: the live member set (the log's,
``consensus.protocol.membership``), over the native client port.

    sdpaxos member list                      id, incarnation, voter/learner, sequencer, site,
                                             addresses, applied position and lag (--json)
    sdpaxos member add --address H:P --client-address H:P --site S [--id N]
                                             a new learner; prints its cluster-file entry and
                                             how to start it (it is promoted once caught up)
    sdpaxos member promote ID                make a caught-up learner a voter now
    sdpaxos member remove ID                 a voter (the sequencer too: the next one takes
                                             over) or a learner
    sdpaxos member replace OLD --address ... a learner that takes OLD's place when promoted
                                             (a replica that lost its disk: a new id)

The cluster file stays the bootstrap configuration: a member added later gets an entry with
``joined = true`` there (``add`` prints it) so that its process and the tools know where it
runs. Where the cluster is: ``--endpoints`` / ``--config`` or ``$SDPAXOS_ENDPOINTS`` /
``$SDPAXOS_CONFIG``. Exit codes (``consensus.runtime.exit_codes``): 0 done; 1 refused (one
change at a time, no such member, the last voter, ids are never reused, denied); 2 usage;
3 unavailable.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from typing import Any

from consensus.errors import ConfigError, DefiniteFailure, IndefiniteFailure
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
    add_client_options,
    native_target,
    run_session,
)
from consensus.runtime.cluster_config import parse_address
from consensus.runtime.exit_codes import OK, REFUSED, USAGE
from consensus.runtime.members import MemberInfo

__all__ = ["add_member_arguments", "run_member"]


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
        sub.add_argument("--address", type=_address, required=True,
                         help="the new member's peer address, host:port")
        sub.add_argument("--client-address", type=_address, required=True,
                         help="the new member's client address, host:port")
        sub.add_argument("--site", required=True, help="where it runs (a region name)")
        sub.add_argument("--id", type=int, default=NO_MEMBER,
                         help="the id wanted (default: the next free one; ids are never reused)")
    for name, help_text in ((PROMOTE, "make a learner a voter now"),
                            (REMOVE, "remove a voter or a learner")):
        sub = actions.add_parser(name, help=help_text)
        add_client_options(sub, after_verb=True)
        sub.add_argument("member", type=int, help="the member's id")


def run_member(args: argparse.Namespace) -> int:
    from consensus.runtime.client import Client

    try:
        target = native_target(args)
    except ConfigError as exc:
        print(f"sdpaxos member {args.action}: {exc}", file=sys.stderr)
        return USAGE

    async def session() -> int:
        if args.action == "list":
            return _show(args, *await _statuses(target.addresses, args.timeout, target.tls))
        async with Client(new_client_id(), target.addresses, timeout_s=args.timeout,
                          attempts=len(target.addresses), tls=target.tls) as client:
            return await _change(client, args)

    return run_session(f"member {args.action}", session())


async def _statuses(addresses: list[tuple[str, int]], timeout_s: float,
                    tls: Any) -> tuple[dict[str, Any], dict[int, dict[str, Any]]]:
    """The status of the reachable member furthest along (epoch, then applied position: a
    removed member still answers, with the configuration it was removed in), and every
    reachable replica's, by id."""
    from consensus.runtime.client import Client

    async def ask(address: tuple[str, int]) -> dict[str, Any] | None:
        try:
            async with Client(new_client_id(), [address], timeout_s=timeout_s,
                              attempts=1, tls=tls) as client:
                status: dict[str, Any] = await client.status()
                return status
        except (IndefiniteFailure, DefiniteFailure, OSError, TimeoutError):
            return None

    answers = [a for a in await asyncio.gather(*(ask(x) for x in addresses)) if a is not None]
    if not answers:
        raise IndefiniteFailure("no replica answered")
    newest = max(answers, key=lambda a: ((a.get("membership") or {}).get("epoch", 0),
                                         a.get("applied", 0)))
    return newest, {int(a["id"]): a for a in answers}


async def _change(client: Any, args: argparse.Namespace) -> int:
    if args.action in (ADD, REPLACE):
        info = MemberInfo(args.address, args.client_address, args.site).encode()
        change = Change(args.action, member=args.id,
                        replaces=args.old if args.action == REPLACE else NO_MEMBER, info=info)
    else:
        change = Change(args.action, member=args.member)
    answer = await client.change_members(change)
    refused = answer.startswith("refused")
    if args.json:
        print(json.dumps({"ok": not refused, "answer": answer}))
    else:
        print(answer)
    if refused:
        return REFUSED
    if args.action in (ADD, REPLACE) and not args.json:
        new_id = int(answer.split(":", 1)[1].split()[0])
        host, port = args.address
        chost, cport = args.client_address
        print("\nAdd to the cluster file (every replica's and the tools' copy):\n"
              f"[[replica]]\nid = {new_id}\naddress = \"{host}:{port}\"\n"
              f"client_address = \"{chost}:{cport}\"\nsite = \"{args.site}\"\njoined = true\n"
              f"\nthen start it: sdpaxos serve --config FILE --id {new_id} "
              "--initial-cluster-state new")
    return OK


def _show(args: argparse.Namespace, status: dict[str, Any],
          others: dict[int, dict[str, Any]]) -> int:
    membership = status.get("membership")
    if membership is None:
        print("sdpaxos member list: this cluster's protocol has no membership changes "
              "(its members are the cluster file's)", file=sys.stderr)
        return USAGE
    rows = []
    front = max(a["applied"] for a in others.values())
    for member_id, incarnation, voter, site, address, client_address in membership["members"]:
        seen = others.get(member_id)  # (a replica the given endpoints do not reach: unknown)
        rows.append({
            "id": member_id, "incarnation": incarnation,
            "role": "voter" if voter else "learner",
            "sequencer": member_id == membership["sequencer"], "site": site,
            "address": address, "client_address": client_address,
            "applied": None if seen is None else seen["applied"],
            "lag": None if seen is None else front - seen["applied"],
        })
    doc = {"source": "the log (the cluster file is the bootstrap configuration)",
           "epoch": membership["epoch"], "closing": membership["closing"] or None,
           "applied": status["applied"], "lag": status["lag"], "members": rows}
    if args.json:
        print(json.dumps(doc))
        return OK
    print(f"members of epoch {doc['epoch']} (from the log; the cluster file is the bootstrap "
          f"configuration), as replica {status['id']} knows them at applied position "
          f"{status['applied']}, lag {status['lag']}"
          + (f"; closing: {membership['closing']} {membership['closing_member']}"
             if membership["closing"] else ""))
    print(f"{'ID':>4}  {'INC':>3}  {'ROLE':<7}  {'SEQ':<3}  {'SITE':<6}  {'ADDRESS':<22}  "
          f"{'CLIENT':<22}  {'APPLIED':>8}  {'LAG':>6}")
    for row in rows:
        applied = "?" if row["applied"] is None else row["applied"]
        lag = "?" if row["lag"] is None else row["lag"]
        print(f"{row['id']:>4}  {row['incarnation']:>3}  {row['role']:<7}  "
              f"{'*' if row['sequencer'] else '':<3}  {row['site']:<6}  {row['address']:<22}  "
              f"{row['client_address']:<22}  {applied:>8}  {lag:>6}")
    return OK
