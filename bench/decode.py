"""``sdpaxos bench decode``: time to decode messages sized by the entries they carry.

What a restarted replica once had to decode: promises of tens of thousands of votes (the
error path made decoding quadratic: 16k votes took 4 s on the event loop) and votes and
new views of as many slots. A frame of ``--entries`` CVotes (split over as many CPromises as
the codec's MAX_ENTRIES needs), one of as many OVotes in Votes, one of as many slots in
NewViews, and one of as many commands in the batches of CAccepts, each decoded ``--repeat``
times; the best time is reported with the time per entry, which stays flat when decoding is
linear. ``CAck frames``: as many frames of one CAck each, what every small frame a replica
receives costs (the envelope and its checks, more than the message).

``--decoder``: the eager decoder (``decode_frame``), the lazy one a replica's node and the
simulator use (``lazy_batches=True``: a CAccept's batch stays packed, its commands decoded
when executed), or both, one after the other for each frame.
"""

from __future__ import annotations

import argparse
import json
import time
from collections.abc import Callable
from typing import Any

from consensus.codec import MAX_BATCH, MAX_ENTRIES, decode_frame, encode_frame
from consensus.messages import (
    EVERY_INDEX,
    CAccept,
    CAck,
    Command,
    CPromise,
    CVote,
    NewView,
    OVote,
    Vote,
)

__all__ = ["add_arguments", "measure", "run"]

_COMMAND = Command(client_id=1, seq=1, op=b"x" * 16, keys=("k",), blind=True)


def _promises(entries: int) -> list[Any]:
    return [
        CPromise(src=0, view=1, owner=1, from_index=start, ballot=4, high=entries - 1,
                 through=EVERY_INDEX,
                 accepted=tuple(CVote(index=i, ballot=1, batch=(_COMMAND,))
                                for i in range(start, min(entries, start + MAX_ENTRIES))))
        for start in range(0, entries, MAX_ENTRIES)
    ]


def _votes(entries: int) -> list[Any]:
    return [
        Vote(src=1, view=2, accepted_view=1, accepted_from=0, executed=0, c_high=(5, 5, 5),
             entries=tuple(OVote(slot=s, owner=s % 3, ballot=1)
                           for s in range(start, min(entries, start + MAX_ENTRIES))))
        for start in range(0, entries, MAX_ENTRIES)
    ]


def _new_views(entries: int) -> list[Any]:
    return [
        NewView(src=2, view=2, start=start,
                owners=tuple(s % 3 for s in range(start, min(entries, start + MAX_ENTRIES))))
        for start in range(0, entries, MAX_ENTRIES)
    ]


def _accepts(entries: int) -> list[Any]:
    commands = tuple(
        Command(client_id=1, seq=seq, op=b"x" * 16, keys=(f"k{seq}",), blind=True)
        for seq in range(entries)
    )
    return [
        CAccept(src=1, view=1, owner=1, index=start, ballot=0,
                batch=commands[start : start + MAX_BATCH])
        for start in range(0, entries, MAX_BATCH)
    ]


def _one_frame(build: Callable[[int], list[Any]]) -> Callable[[int], list[bytes]]:
    return lambda entries: [encode_frame(build(entries))]


def _ack_frames(entries: int) -> list[bytes]:
    return [encode_frame([CAck(src=1, view=1, owner=1, index=4, ballot=0)])] * entries


#: kind -> entries -> the frames to decode
KINDS: dict[str, Callable[[int], list[bytes]]] = {
    "CPromise.accepted": _one_frame(_promises),
    "Vote.entries": _one_frame(_votes),
    "NewView.owners": _one_frame(_new_views),
    "CAccept.batch": _one_frame(_accepts),
    "CAck frames": _ack_frames,
}
DECODERS: dict[str, tuple[str, ...]] = {
    "eager": ("eager",), "lazy": ("lazy",), "both": ("eager", "lazy")
}


def measure(sizes: list[int], repeat: int, decoder: str = "eager") -> list[dict[str, Any]]:
    rows = []
    for kind, build in KINDS.items():
        for entries in sizes:
            frames = build(entries)
            for name in DECODERS[decoder]:
                lazy = name == "lazy"
                best = min(_timed(frames, lazy) for _ in range(repeat))
                rows.append({"kind": kind, "decoder": name, "entries": entries,
                             "bytes": sum(map(len, frames)), "decode_ms": round(best * 1000, 3),
                             "ns_per_entry": round(best * 1e9 / entries, 1)})
    return rows


def _timed(frames: list[bytes], lazy: bool) -> float:
    started = time.perf_counter()
    for frame in frames:
        decode_frame(frame, lazy_batches=lazy)
    return time.perf_counter() - started


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--entries", type=int, nargs="+", default=[1_000, 10_000, 100_000],
                        help="entries per frame (CAck frames: frames), one per size and kind")
    parser.add_argument("--repeat", type=int, default=5,
                        help="decodes per frame (the best is reported)")
    parser.add_argument("--decoder", choices=sorted(DECODERS), default="eager",
                        help="decode_frame whole (eager), as a replica does (lazy), or both")
    parser.add_argument("--json", action="store_true", help="print one JSON object")


def run(args: argparse.Namespace) -> int:
    if any(n < 1 for n in args.entries) or args.repeat < 1:
        raise SystemExit("sdpaxos bench decode: --entries and --repeat must be positive")
    rows = measure(args.entries, args.repeat, args.decoder)
    if args.json:
        print(json.dumps({"rows": rows}))
        return 0
    print(f"{'kind':<20} {'decoder':<7} {'entries':>8} {'bytes':>10} {'decode ms':>10} "
          f"{'ns/entry':>9}")
    for row in rows:
        print(f"{row['kind']:<20} {row['decoder']:<7} {row['entries']:>8} {row['bytes']:>10} "
              f"{row['decode_ms']:>10} {row['ns_per_entry']:>9}")
    return 0
