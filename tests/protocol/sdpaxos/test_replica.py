"""The facade (replica.py): the driver contract of ``ready`` and ``advance``, the role
transitions and the lifecycle announcements.
"""

from __future__ import annotations

import pytest
from util import core, drain

from consensus.errors import LocalProtocolError
from consensus.messages import NO_LEASE_REQUEST, Heartbeat, OAccept, OAck, OEntry, ViewRecord
from consensus.protocol.ready import Ready
from consensus.protocol.types import Role

from .builders import A

# =========================================================================== driver contract


def test_ready_twice_without_advance_raises() -> None:
    r1 = core(3, 1)
    r1.propose(A, 0)
    first = r1.ready()
    with pytest.raises(LocalProtocolError):
        r1.ready()
    with pytest.raises(LocalProtocolError):
        r1.advance(Ready())
    # no input between them: a replica counts its own acceptances at once because nothing
    # that could complete a majority with one is stepped before the turn is durable
    with pytest.raises(LocalProtocolError, match="between ready"):
        r1.step(OAck(src=0, view=0, slots=(0,)), 1)
    with pytest.raises(LocalProtocolError, match="between ready"):
        r1.tick(1)
    r1.advance(first)
    with pytest.raises(LocalProtocolError):
        r1.advance(first)
    assert r1.ready().is_empty()


# =========================================================================== roles


def test_roles_change_only_along_the_table() -> None:
    r0 = core(3, 0)  # the sequencer of view 0, its start view
    assert r0.role is Role.SEQUENCER
    for role in (Role.CANDIDATE, Role.ESTABLISHING, Role.SEQUENCER):
        with pytest.raises(LocalProtocolError, match=r"invalid role transition \[sequencer"):
            r0.become(role)
    r0.join_view(3)  # a higher view: a follower, whatever it was
    assert (r0.role, r0.view, r0.view_ready) == (Role.FOLLOWER, 3, False)
    r0.become(Role.CANDIDATE)
    with pytest.raises(LocalProtocolError, match=r"\[candidate -> sequencer\]"):
        r0.become(Role.SEQUENCER)
    r0.become(Role.ESTABLISHING)
    r0.become(Role.SEQUENCER)
    assert r0.role is Role.SEQUENCER


def test_a_higher_view_is_announced_once_and_every_part_resets_its_own_state() -> None:
    r1 = core(3, 1)
    r1.propose(A, 0)
    drain(r1)
    r1.step(OAccept(src=0, view=0, entries=(OEntry(slot=0, owner=1),)), 0)
    r1.step(OAck(src=0, view=0, slots=(0,)), 0)
    drain(r1)
    # three replicas: the sequencer's acceptance (its own OAck) and ours are a majority
    assert r1.o_log.committed == {0}
    r1.step(Heartbeat(src=0, view=3, executed=0, lease_request=NO_LEASE_REQUEST), 5)
    ready = drain(r1)
    assert ready.persist[0] == ViewRecord(view=3)
    assert (r1.view, r1.role, r1.view_ready) == (3, Role.FOLLOWER, False)
    assert r1.o_log.committed == set() and r1.o_log.committed_mine == 0
    assert r1.election.seq_alive_at == 5 and r1.views.last_view_change_at == 5
