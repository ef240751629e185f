"""``sdpaxos get | put | del | cas | watch``: the key-value state machine (``kv`` kind,
``consensus.statemachine.KVStore``) from the command line, over the native client port.

    sdpaxos get KEY [--stale]            the value (linearizable read unless --stale)
    sdpaxos put KEY VALUE                write it
    sdpaxos del KEY                      delete it
    sdpaxos cas KEY NEW --expect OLD     write NEW only if KEY holds OLD (--absent: no value)
    sdpaxos watch KEY [--count N] [--wait S] [--current]   print each change of KEY's value

Where the cluster is: ``--endpoints`` / ``--config`` or ``$SDPAXOS_ENDPOINTS`` /
``$SDPAXOS_CONFIG`` (``consensus.runtime.client_options``). Each invocation is a client
session of its own (a random client id): a write re-sent to another replica takes effect once.
Its one write closes the session (``consensus.sessions``: a one-shot session), so scripted
writes leave nothing in the replicated session table once their open-by time passed.

``watch`` needs no support from the store, which keeps no revisions or change history: it
polls the key with linearizable reads every ``--interval`` and prints the value each time it
differs from the last one seen. So it reports the key's latest value, level-triggered (like a
Kubernetes informer's resync), not every write: writes between two polls that end where they
began (put x, put y, put x) show as no change, and several writes as the last of them.

Exit codes (``consensus.runtime.exit_codes``): 0 done; 1 a definite refusal (``get``/``del``:
the key is not found; ``cas``: conflict; a TLS cluster denied it; the store refused the
operation; ``watch``: fewer than ``--count`` changes within ``--wait``); 2 usage (also: the
cluster file names another state machine); 3 unavailable (no replica answered in time).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import sys
from collections.abc import Awaitable, Callable
from typing import TYPE_CHECKING, Any

import msgpack

from consensus.errors import ConfigError, DefiniteFailure
from consensus.runtime.client import new_client_id
from consensus.runtime.client_options import (
    add_client_options,
    native_target,
    run_session,
    tool_client,
)
from consensus.runtime.exit_codes import OK, REFUSED, USAGE
from consensus.runtime.state_machines import DEFAULT_KIND
from consensus.statemachine import kv_cas, kv_delete, kv_get, kv_put

if TYPE_CHECKING:
    from consensus.runtime.client import Client

__all__ = [
    "add_cas_arguments",
    "add_del_arguments",
    "add_get_arguments",
    "add_put_arguments",
    "add_watch_arguments",
    "run_cas",
    "run_del",
    "run_get",
    "run_put",
    "run_watch",
]

#: seconds between two reads of a watched key (default of --interval)
WATCH_POLL_S = 0.1


# ---------------------------------------------------------------------------- arguments


def _key(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("key", metavar="KEY", help="the key")
    add_client_options(parser)


def add_get_arguments(parser: argparse.ArgumentParser) -> None:
    _key(parser)
    parser.add_argument("--stale", action="store_true",
                        help="read the replica's local state (fast, possibly old) instead of "
                        "a linearizable read")


def add_put_arguments(parser: argparse.ArgumentParser) -> None:
    _key(parser)
    parser.add_argument("value", metavar="VALUE", help="the value to store")


def add_del_arguments(parser: argparse.ArgumentParser) -> None:
    _key(parser)


def add_cas_arguments(parser: argparse.ArgumentParser) -> None:
    _key(parser)
    parser.add_argument("new", metavar="NEW", help="the value to store if KEY holds the "
                        "expected one")
    expected = parser.add_mutually_exclusive_group(required=True)
    expected.add_argument("--expect", metavar="OLD", help="the value KEY must hold now")
    expected.add_argument("--absent", action="store_true", help="KEY must hold no value now")


def add_watch_arguments(parser: argparse.ArgumentParser) -> None:
    _key(parser)
    parser.add_argument("--count", type=int, default=0, metavar="N",
                        help="stop after N changes (default: 0, never)")
    parser.add_argument("--wait", type=float, default=None, metavar="SECONDS",
                        help="stop after this long (with --count: exit 1 if fewer changes "
                        "came); default: no limit")
    parser.add_argument("--current", action="store_true",
                        help="print the key's current value first (not counted as a change)")
    parser.add_argument("--interval", type=float, default=WATCH_POLL_S, metavar="SECONDS",
                        help=f"seconds between two reads of KEY (default: {WATCH_POLL_S:g})")


# ---------------------------------------------------------------------------- running

Verb = Callable[["Client", argparse.Namespace], Awaitable[int]]


def _run(verb_name: str, verb: Verb, args: argparse.Namespace) -> int:
    try:
        target = native_target(args)
    except ConfigError as exc:
        print(f"sdpaxos {verb_name}: {exc}", file=sys.stderr)
        return USAGE
    if target.config is not None and target.config.state_machine != DEFAULT_KIND:
        print(f"sdpaxos {verb_name}: the cluster runs the {target.config.state_machine!r} "
              f"state machine, not the key-value store ({DEFAULT_KIND!r})", file=sys.stderr)
        return USAGE

    async def session() -> int:
        async with tool_client(target, new_client_id(), args.timeout) as client:
            return await verb(client, args)

    return run_session(verb_name, session())


def _result(payload: bytes | str, expected: str) -> list[Any]:
    """The store's msgpack result, checked to be ``[expected, ...]``; ``DefiniteFailure``
    with the store's reason for ``["error", reason]`` (another state machine, say)."""
    try:
        result = msgpack.unpackb(payload) if isinstance(payload, bytes) else None
    except Exception:
        result = None
    if isinstance(result, list) and result and result[0] == "error":
        raise DefiniteFailure(f"the store refused it: {result[1:]}")
    if not isinstance(result, list) or not result or result[0] != expected:
        raise DefiniteFailure(f"not a key-value store's answer: {payload!r}")
    return result


def _emit(args: argparse.Namespace, doc: dict[str, Any], text: str) -> None:
    print(json.dumps(doc) if args.json else text, flush=True)


async def _get(client: Client, args: argparse.Namespace) -> int:
    reply = await client.read(kv_get(args.key), (args.key,), stale=args.stale)
    value = _result(reply.payload, "value")[1]
    if value is None:
        if args.json:
            _emit(args, {"key": args.key, "value": None}, "")
        print(f"sdpaxos get: {args.key!r} not found", file=sys.stderr)
        return REFUSED
    _emit(args, {"key": args.key, "value": value}, str(value))
    return OK


async def _put(client: Client, args: argparse.Namespace) -> int:
    reply = await client.execute(kv_put(args.key, args.value), (args.key,), last=True)
    _result(reply.payload, "ok")
    _emit(args, {"key": args.key, "value": args.value, "position": reply.position}, "OK")
    return OK


async def _del(client: Client, args: argparse.Namespace) -> int:
    reply = await client.execute(kv_delete(args.key), (args.key,), last=True)
    existed = bool(_result(reply.payload, "deleted")[1])
    _emit(args, {"key": args.key, "deleted": existed, "position": reply.position},
          f"deleted {args.key}" if existed else "")
    if not existed:
        print(f"sdpaxos del: {args.key!r} not found (nothing deleted)", file=sys.stderr)
        return REFUSED
    return OK


async def _cas(client: Client, args: argparse.Namespace) -> int:
    expected = None if args.absent else args.expect
    reply = await client.execute(kv_cas(args.key, expected, args.new), (args.key,), last=True)
    _, swapped, before = _result(reply.payload, "cas")
    _emit(args, {"key": args.key, "swapped": bool(swapped), "before": before,
                 "position": reply.position},
          "OK" if swapped else f"conflict: {args.key} holds "
          f"{'no value' if before is None else repr(before)}")
    return OK if swapped else REFUSED


async def _watch(client: Client, args: argparse.Namespace) -> int:
    seen = 0

    async def changes() -> None:
        nonlocal seen
        last = _result((await client.read(kv_get(args.key), (args.key,))).payload, "value")[1]
        if args.current:
            _emit(args, {"key": args.key, "value": last, "current": True},
                  f"{args.key} {'(no value)' if last is None else last}")
        while not args.count or seen < args.count:
            await asyncio.sleep(args.interval)
            value = _result((await client.read(kv_get(args.key), (args.key,))).payload,
                            "value")[1]
            if value == last:
                continue
            last = value
            seen += 1
            _emit(args, {"key": args.key, "value": value},
                  f"{args.key} deleted" if value is None else f"{args.key} {value}")

    try:
        async with asyncio.timeout(args.wait):
            await changes()
    except TimeoutError:
        if args.count and seen < args.count:  # waited out before the changes asked for came
            print(f"sdpaxos watch: {seen} of {args.count} changes within {args.wait:g}s",
                  file=sys.stderr)
            return REFUSED
    return OK


def run_get(args: argparse.Namespace) -> int:
    return _run("get", _get, args)


def run_put(args: argparse.Namespace) -> int:
    return _run("put", _put, args)


def run_del(args: argparse.Namespace) -> int:
    return _run("del", _del, args)


def run_cas(args: argparse.Namespace) -> int:
    return _run("cas", _cas, args)


def run_watch(args: argparse.Namespace) -> int:
    return _run("watch", _watch, args)
