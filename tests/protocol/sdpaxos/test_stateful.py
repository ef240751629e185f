"""Stateful property test: real SDPaxos cores over an adversarial in-flight message bag.

Hypothesis proposes commands, delivers any in-flight message (so messages are reordered),
duplicates and drops some (bounded), and advances time on one replica at a time. After every
step the safety invariants hold:

* executed sequences are prefixes of one another (same command at each (slot, offset));
* no replica executes a command twice, or one never proposed, or out of log order, and
  ``led_here`` is true exactly at the command's leader;
* within a view, every O-instance has one owner in every OAccept and OAcceptedRecord;
* a command is reported ready once, by its leader only, and never fails afterwards.

At teardown the network heals — everything in flight is delivered and every replica's
timers run, ``retransmit_us`` apart, until the cluster settles — and then every command a
leader reported ready, and every command proposed whose one copy did not fail, has executed
on every replica, and every leader has reported its executed commands ready.

Machines:

* ``SDPaxosMachine`` (N=3), ``SDPaxosMachine5`` and ``SDPaxosMachine5Thrifty``: failure
  detection is configured out (a huge election timeout, no straggler detection), so the
  cluster stays in view 0 and no command can fail: the normal-case protocol and its repair
  paths (retransmission, CRequest, Catchup) under loss, duplication and reordering; their
  O-instances never hold ``NO_CL``.
* ``SDPaxosViewChangeMachine``: real election timeouts plus rules that cut a replica off
  while time passes, so sequencers get replaced (§3.3) and C-instances recovered.
* ``SDPaxosCrashMachine`` (N=5): the same, plus crash-restarts from durable records.

The settings are derandomized, so a run is reproducible; for a wider search raise
``max_examples`` and drop ``derandomize``. The teardown's liveness check is what once caught an
N=3 sequencer never re-sending its own O-instance lost to every peer (now covered alone by
``test_readiness.py::test_n3_cluster_recovers_sequencer_slot_lost_to_every_peer``).
"""

from __future__ import annotations

import itertools

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)
from util import Net, cmd

from consensus.config import ProtocolConfig
from consensus.messages import NO_CL, Command, OAccept, OAcceptedRecord
from consensus.protocol.ready import Ready

MAX_DROPS = 8
MAX_DUPS = 8
MAX_ISOLATIONS = 3
MAX_RESTARTS = 2
RETRANSMIT_US = 200_000
HEAL_ROUNDS = 40


class SDPaxosMachine(RuleBasedStateMachine):
    replicas = 3
    thrifty = False
    #: failure detection on: sequencer elections (view changes) and C-instance recovery
    view_changes = False

    def __init__(self) -> None:
        super().__init__()
        config = ProtocolConfig(
            replicas=self.replicas,
            thrifty=self.thrifty,
            max_batch=3,
            retransmit_us=RETRANSMIT_US,
            catchup_us=300_000,
            election_timeout_us=300_000 if self.view_changes else 1 << 50,
            lease_us=250_000,
            straggler_windows=0,
        )
        self.net = Net(config, trace=False, on_ready=self._observe)
        self.proposed: dict[tuple[int, int], int] = {}  # (client, seq) -> leader
        self.next_client = 0
        self.drops = 0
        self.dups = 0
        self.isolations = 0
        self.restarts = 0
        self.reported: list[set[tuple[int, int]]] = [set() for _ in range(self.replicas)]
        self.slot_owner: dict[tuple[int, int], int] = {}  # (view, slot) -> owner proposed
        self.ready_seen: set[tuple[int, int]] = set()
        self.failed: set[tuple[int, int]] = set()

    # ---------------------------------------------------------------- observation
    def _note_slot(self, view: int, slot: int, owner: int, where: str) -> None:
        known = self.slot_owner.setdefault((view, slot), owner)
        assert known == owner, f"view {view} slot {slot}: owners {known} and {owner} ({where})"

    def _observe(self, replica: int, ready: Ready) -> None:
        # one proposer per view: an O-instance has one value per view, whoever reports it
        for record in ready.persist:
            if isinstance(record, OAcceptedRecord):
                assert self.view_changes or record.view == 0
                for entry in record.entries:
                    self._note_slot(record.view, entry.slot, entry.owner, f"record at {replica}")
        for out in ready.send_after_persist + ready.send:
            message = out.message
            if isinstance(message, OAccept):
                assert self.view_changes or message.view == 0
                for entry in message.entries:
                    self._note_slot(message.view, entry.slot, entry.owner, "OAccept")
        for command in ready.ready:
            key = (command.client_id, command.seq)
            assert self.proposed.get(key) == replica, f"{key} ready at non-leader {replica}"
            assert key not in self.reported[replica], f"{key} reported ready twice"
            self.reported[replica].add(key)
            self.ready_seen.add(key)
        for failure in ready.failed:
            key = (failure.command.client_id, failure.command.seq)
            assert self.view_changes, f"{key} failed without any recovery"
            # never definite: the core cannot know of copies elsewhere (``ready.Failure``)
            assert not failure.definite
            assert key not in self.ready_seen, f"{key} failed after it was ready"
            self.failed.add(key)
        # a command reported ready may not fail later either
        assert not (self.failed & self.ready_seen)

    # ---------------------------------------------------------------- rules
    @initialize()
    def start(self) -> None:
        for replica in range(self.replicas):
            self.net.tick(replica, at=0)

    @rule(replica=st.integers(0, 4), count=st.integers(1, 4))
    def propose(self, replica: int, count: int) -> None:
        replica %= self.replicas
        commands: list[Command] = []
        for _ in range(count):
            client = self.next_client
            self.next_client += 1
            self.proposed[(client, 0)] = replica
            commands.append(cmd(client, 0))
        self.net.propose(replica, *commands)

    @precondition(lambda self: self.net.bag)
    @rule(data=st.data())
    def deliver(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.net.bag) - 1), label="deliver")
        self.net.deliver(self.net.bag[index])

    @precondition(lambda self: self.net.bag)
    @rule(data=st.data())
    def deliver_oldest(self, data: st.DataObject) -> None:
        count = data.draw(st.integers(1, 8), label="how many")
        for _ in range(min(count, len(self.net.bag))):
            self.net.deliver(self.net.bag[0])

    @precondition(lambda self: self.net.bag and self.dups < MAX_DUPS)
    @rule(data=st.data())
    def duplicate(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.net.bag) - 1), label="duplicate")
        self.dups += 1
        self.net.duplicate(self.net.bag[index])

    @precondition(lambda self: self.net.bag and self.drops < MAX_DROPS)
    @rule(data=st.data())
    def drop(self, data: st.DataObject) -> None:
        index = data.draw(st.integers(0, len(self.net.bag) - 1), label="drop")
        self.drops += 1
        self.net.drop(self.net.bag[index])

    @rule(replica=st.integers(0, 4), dt=st.sampled_from([0, 10_000, 100_000, RETRANSMIT_US]))
    def tick(self, replica: int, dt: int) -> None:
        self.net.tick(replica % self.replicas, at=self.net.now + dt)

    # ---------------------------------------------------------------- invariants
    @invariant()
    def executed_logs_are_prefixes_of_one_another(self) -> None:
        logs = [
            [(e.slot, e.offset, e.command.client_id, e.command.seq) for e in executed]
            for executed in self.net.executed
        ]
        longest = max(logs, key=len)
        for replica, log in enumerate(logs):
            assert log == longest[: len(log)], f"replica {replica} diverges"

    @invariant()
    def executions_are_well_formed(self) -> None:
        for replica, executed in enumerate(self.net.executed):
            keys = [(e.command.client_id, e.command.seq) for e in executed]
            assert len(keys) == len(set(keys)), f"replica {replica} executed a command twice"
            positions = [e.position for e in executed]
            assert positions == sorted(positions), f"replica {replica} out of order"
            for e in executed:
                key = (e.command.client_id, e.command.seq)
                assert key in self.proposed, f"{key} was never proposed"
                assert e.led_here == (self.proposed[key] == replica), (replica, e)
                # each command is proposed once here: its only copy failed, so it never runs
                assert key not in self.failed, f"{key} executed after its only copy failed"
                if not self.view_changes:
                    assert self.slot_owner.get((0, e.slot)) == self.proposed[key], (replica, e)
            # offsets restart at 0 in each slot and count up without a gap
            for previous, current in itertools.pairwise(executed):
                if current.slot == previous.slot:
                    assert current.offset == previous.offset + 1
                else:
                    assert current.offset == 0

    @invariant()
    def executed_frontiers_match_the_cores(self) -> None:
        for replica, core in enumerate(self.net.cores):
            executed = self.net.executed[replica]
            if executed:
                assert core.executed_through() >= executed[-1].slot
            log = core.committed_log()
            for e in executed:
                assert log[e.slot][e.offset] == e.command

    # ---------------------------------------------------------------- healing
    def teardown(self) -> None:
        net = self.net
        for _ in range(HEAL_ROUNDS):
            net.deliver_all()
            if self._settled():
                break
            net.now += RETRANSMIT_US
            for replica in range(self.replicas):
                net.tick(replica)
        net.deliver_all()
        self.executed_logs_are_prefixes_of_one_another()
        self.executions_are_well_formed()
        everyone = [
            {(e.command.client_id, e.command.seq) for e in executed}
            for executed in net.executed
        ]
        for replica, done in enumerate(everyone):
            missing_ready = self.ready_seen - done
            assert not missing_ready, f"ready but not executed at {replica}: {missing_ready}"
            missing = set(self.proposed) - done - self.failed
            assert not missing, f"proposed, not failed, not executed at {replica}: {missing}"
        # with every command executed, every leader has reported every command ready
        assert self.ready_seen == set(self.proposed) - self.failed
        frontiers = {core.executed_through() for core in net.cores}
        assert len(frontiers) == 1, frontiers
        if not self.view_changes:
            assert all(owner != NO_CL for owner in self.slot_owner.values())
            assert frontiers == {max(slot for _, slot in self.slot_owner) if self.slot_owner
                                 else -1}

    def _settled(self) -> bool:
        counts = {len(executed) for executed in self.net.executed}
        frontiers = {core.executed_through() for core in self.net.cores}
        decided = len(self.proposed) - len(self.failed)
        return (
            counts == {decided}
            and len(frontiers) == 1
            and self.ready_seen == set(self.proposed) - self.failed
        )


class SDPaxosViewChangeMachine(SDPaxosMachine):
    view_changes = True

    @precondition(lambda self: self.isolations < MAX_ISOLATIONS)
    @rule(replica=st.integers(0, 4), dt=st.sampled_from([100_000, 400_000]))
    def isolate(self, replica: int, dt: int) -> None:
        """Lose everything in flight to or from ``replica`` and let time pass for all but it:
        a sequencer cut off this way gets replaced, a leader's instances recovered."""
        replica %= self.replicas
        self.isolations += 1
        for flight in list(self.net.bag):
            if replica in (flight.src, flight.dst):
                self.net.drop(flight)
        self.net.now += dt
        for other in range(self.replicas):
            if other != replica:
                self.net.tick(other)
        for flight in list(self.net.bag):
            if replica in (flight.src, flight.dst):
                self.net.drop(flight)

    @rule(dt=st.sampled_from([50_000, 200_000, 400_000]))
    def tick_all(self, dt: int) -> None:
        self.net.now += dt
        for replica in range(self.replicas):
            self.net.tick(replica)


class SDPaxosCrashMachine(SDPaxosViewChangeMachine):
    replicas = 5

    @precondition(lambda self: self.restarts < MAX_RESTARTS)
    @rule(replica=st.integers(0, 4))
    def restart(self, replica: int) -> None:
        """Crash ``replica`` between turns; it comes back from its durable records."""
        replica %= self.replicas
        self.restarts += 1
        self.net.restart(replica, seed=self.restarts)
        self.reported[replica].clear()  # a new incarnation may report its commands again


class SDPaxosMachine5(SDPaxosMachine):
    replicas = 5


class SDPaxosMachine5Thrifty(SDPaxosMachine):
    replicas = 5
    thrifty = True


_SETTINGS = settings(
    max_examples=100,
    stateful_step_count=50,
    deadline=None,
    derandomize=True,
    suppress_health_check=[HealthCheck.too_slow],
)


TestSDPaxos3 = SDPaxosMachine.TestCase
TestSDPaxos3.settings = _SETTINGS
TestSDPaxos5 = SDPaxosMachine5.TestCase
TestSDPaxos5.settings = _SETTINGS
TestSDPaxos5Thrifty = SDPaxosMachine5Thrifty.TestCase
TestSDPaxos5Thrifty.settings = settings(_SETTINGS, max_examples=60)
TestSDPaxosViewChange3 = SDPaxosViewChangeMachine.TestCase
TestSDPaxosViewChange3.settings = _SETTINGS
TestSDPaxosCrash5 = SDPaxosCrashMachine.TestCase
TestSDPaxosCrash5.settings = settings(_SETTINGS, max_examples=60)


def test_a_restarted_leader_reports_what_was_decided_before_it_drove_it() -> None:
    """(Found by TestSDPaxosCrash5.) The sequencer proposes and crashes; its CAccepts in flight
    get acknowledged and its restarted incarnation learns the instance chosen before it
    resumed driving its own instances, so nothing reported the command ready when it ran."""
    machine = SDPaxosCrashMachine()
    machine.start()
    machine.propose(replica=0, count=1)
    machine.restart(replica=0)
    machine.teardown()
    assert machine.ready_seen == {(0, 0)}
