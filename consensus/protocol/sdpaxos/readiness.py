"""TODO readiness"""

from __future__ import annotations

from typing import TYPE_CHECKING

from consensus.protocol.types import Role

if TYPE_CHECKING:
    from consensus.protocol.sdpaxos.replica import SDPaxosReplica



class Readiness:
    """TODO"""

    def __init__(self, r: SDPaxosReplica) -> None:
        self.r = r

    def ordered_own(self) -> int:
        """How many of my C-instances the ready rule considers durably ordered."""
        r = self.r
        if not r.five:
            return r.my_committed_o
        if r.is_sequencer:
            if r.role is not Role.SEQUENCER:
                return r.exec_count[r.me]
            if "go_ready_rule" in r.unsafe:
                return len(r.ordering.seq_slots[r.me])
            return r.ordering.seq_slots[r.me].count_below(r.ordering.majority_prefix())
        return r.prefix_mine

    def check_ready(self) -> None:
        r = self.r
        if not r.unready:
            return
        ordered = self.ordered_own()
        for index in sorted(r.unready):
            if index >= ordered:
                break
            inst = r.c[(r.me, index)]
            if inst.committed:
                batch = r.unready.pop(index)
                if inst.batch == batch:
                    r.out.ready.extend(batch)
