"""``ClusterStore.apply_batch``: a slot's commands applied at once give what ``apply`` gives
one command at a time — results, events, revisions, sessions and snapshot bytes — however the
log is cut into batches, a reconfiguration (a new allocator) in the middle of one included."""

from __future__ import annotations

import random

import msgpack
from cs_helpers import MULTI_CHAIN_YAML
from reconfig_helpers import variant

from cluster_state import ClusterStore, parse_config, reconfigure, release, set_node_health, submit
from cluster_state.authz import AuthorizedStore
from consensus.messages import Command
from consensus.sessions import log_time_command


def commands(seed: int, count: int) -> list[Command]:
    """Submits and releases, node health, retries, garbage, log-time commands and two
    reconfigurations, from a few clients."""
    rng = random.Random(seed)
    live: list[str] = []
    out: list[Command] = []
    for seq in range(1, count + 1):
        if seq in (count // 3, 2 * count // 3):
            op = reconfigure(variant("without_a3" if seq == count // 3 else "rack_c_added"))
        elif seq % 97 == 0:
            out.append(log_time_command(1_000 + seq))
            continue
        elif out and rng.random() < 0.1:
            out.append(rng.choice(out))  # a retry: its first result
            continue
        elif rng.random() < 0.05:
            op = rng.choice((b"\xc1 garbage", set_node_health("dgx-a1", rng.random() < 0.5)))
        elif live and rng.random() < 0.4:
            op = release(live.pop(rng.randrange(len(live))))
        else:
            name = f"g{seq}"
            op = submit(name, rng.choice(["VC1", "VC2", "VC3"]), rng.choice([-1, 0, 5, 500]),
                        [(rng.choice([1, 2]), rng.choice([1, 2, 4]))])
            live.append(name)
        out.append(Command(client_id=1 + seq % 3, seq=seq, op=op))
    return out


def test_apply_batch_gives_what_apply_gives_one_by_one() -> None:
    log = commands(seed=7, count=600)
    for kind in (ClusterStore, AuthorizedStore):
        one_by_one = kind(parse_config(MULTI_CHAIN_YAML), event_limit=300)
        batched = kind(parse_config(MULTI_CHAIN_YAML), event_limit=300)
        expected = [one_by_one.apply(100 + k, command) for k, command in enumerate(log)]
        results: list[bytes] = []
        rng = random.Random(3)
        start = 0
        while start < len(log):
            size = rng.choice((0, 1, 2, 17, 64, 250))
            results += batched.apply_batch(100 + start, log[start : start + size])
            start += size
        assert results == expected
        assert batched.events.events == one_by_one.events.events
        assert batched.revision == one_by_one.revision
        assert batched.applied_position == one_by_one.applied_position == 100 + len(log) - 1
        assert batched.snapshot() == one_by_one.snapshot()
        assert len(batched.configs) == 3  # both reconfigurations ran
        kinds = {msgpack.unpackb(result)[0] for result in results}
        assert {"placed", "released", "reconfigured", "error"} <= kinds
        if isinstance(batched, AuthorizedStore):
            seen = [name for name in (f"g{seq}" for seq in range(len(log)))
                    if one_by_one.seen_vc_of(name) is not None]
            assert len(seen) > 100
            assert [batched.seen_vc_of(n) for n in seen] == [one_by_one.seen_vc_of(n)
                                                             for n in seen]
