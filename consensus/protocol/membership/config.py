"""The member set of one epoch, and the rules that change it (pure data, no I/O).

A ``Configuration`` says who votes in epoch ``epoch`` (``voters``, in core-index order: the
epoch's SDPaxos core numbers its replicas 0..n-1 and index 0 is its first sequencer), who
learns (``learners``), where the epoch's log starts in the global log (``base``) and which
member ids are free (``next_id``: ids are never reused, so a frame from a removed member can
never pass for a new one).

A change (``Change``) is a command in the log (``encode_change``/``decode_change``: the op is
``MEMBER_OP`` then JSON; ``0xc1`` is never the first byte of msgpack, so no state machine's op
looks like one). Every replica applies the changes it executes with ``apply_change``, in log
order, so every replica holds the same configuration at the same slot. Rules
(``apply_change``):

* One change at a time: while a voter change waits for its epoch to close (``closing``) every
  other change is refused; while a learner catches up, only its promotion or its removal
  (which cancels the change) is taken.
* ``add`` makes a new learner (the next free id, or the one asked if free); ``replace`` too,
  naming the voter it will replace. A learner never votes.
* ``promote`` makes a learner a voter (and retires the voter it replaces): the voter set
  changes, so the epoch closes and the next one starts with the new voters (``next_epoch``).
* ``remove`` retires a learner at once, or a voter through a new epoch; the last voter cannot
  be removed.
* Sizes: any number of voters >= 1 (quorum = majority); the next epoch's sequencer is the
  first voter of the old order that stays, so removing the sequencer moves it to the next one.
* ``publish`` sets a member's ``info`` (where it runs: its addresses), at once and at any time
  (one change at a time does not apply: no voter changes). A member publishes its own when
  the configuration says otherwise (``MemberReplica``), as an etcd member publishes its client
  URLs through the log on start: so the addresses of every member, the ones a cluster started
  with included, are a fact of the log that every replica and tool reads the same.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, replace
from typing import Final

from consensus.messages import MAX_KEY_BYTES

__all__ = [
    "EPOCH_SHIFT",
    "MEMBER_OP",
    "NO_MEMBER",
    "Change",
    "Configuration",
    "Member",
    "apply_change",
    "bootstrap",
    "decode_change",
    "encode_change",
    "next_epoch",
]

#: The views of epoch ``e`` are ``[e << EPOCH_SHIFT, (e + 1) << EPOCH_SHIFT)``: a message's view
#: says its epoch, so the wire needs no other tag (and epoch 0 is what a cluster always was).
EPOCH_SHIFT: Final = 40
#: the first bytes of a membership change's op (0xc1 is never the first byte of msgpack)
MEMBER_OP: Final = b"\xc1member:"
#: no member (a learner that replaces nobody)
NO_MEMBER: Final = -1
#: the change kinds
ADD: Final = "add"
REPLACE: Final = "replace"
PROMOTE: Final = "promote"
REMOVE: Final = "remove"
PUBLISH: Final = "publish"
KINDS: Final = (ADD, REPLACE, PROMOTE, REMOVE, PUBLISH)
#: the largest member id (ids are non-negative int64 on the wire; far below that in practice)
MAX_MEMBER_ID: Final = (1 << 31) - 1
#: the longest ``info`` (a string on the wire: the codec's limit for one)
MAX_INFO_BYTES: Final = MAX_KEY_BYTES


@dataclass(frozen=True, slots=True)
class Member:
    id: int
    incarnation: int
    voter: bool
    #: where it runs (address, client address, site...): opaque here, the runtime's
    info: str = ""
    #: a learner that takes this voter's place when promoted (``NO_MEMBER``: none)
    replaces: int = NO_MEMBER


@dataclass(frozen=True, slots=True)
class Configuration:
    epoch: int
    #: the global slot of this epoch's slot 0
    base: int
    #: voter ids in core-index order (index 0 is the epoch's first sequencer)
    voters: tuple[int, ...]
    #: every member, voters and learners, by id
    members: tuple[Member, ...]
    #: the next id ``add`` hands out (ids are never reused)
    next_id: int
    #: the voter change (``PROMOTE`` or ``REMOVE``, and its member) that closes this epoch,
    #: once executed ("" while none is); ``next_epoch`` applies it at the epoch's SEAL
    closing: str = ""
    closing_member: int = NO_MEMBER

    def member(self, member_id: int) -> Member | None:
        for member in self.members:
            if member.id == member_id:
                return member
        return None

    def index_of(self, member_id: int) -> int | None:
        """The member's index in this epoch's core, or None if it does not vote."""
        try:
            return self.voters.index(member_id)
        except ValueError:
            return None

    @property
    def learners(self) -> tuple[int, ...]:
        return tuple(m.id for m in self.members if not m.voter)

    @property
    def start_view(self) -> int:
        """The epoch's first view: the first one at or above its range that index 0 leads."""
        n = len(self.voters)
        first = self.epoch << EPOCH_SHIFT
        return -(-first // n) * n

    def describe(self) -> str:
        learners = f", learners {list(self.learners)}" if self.learners else ""
        return f"epoch {self.epoch}: voters {list(self.voters)}{learners}"


def bootstrap(replicas: int) -> Configuration:
    """The configuration a cluster starts with: ``replicas`` voters, ids 0..replicas-1."""
    return Configuration(
        epoch=0, base=0, voters=tuple(range(replicas)),
        members=tuple(Member(i, 1, True) for i in range(replicas)), next_id=replicas,
    )


@dataclass(frozen=True, slots=True)
class Change:
    kind: str
    #: the member it is about (``add``: the id wanted, or NO_MEMBER for the next free one)
    member: int = NO_MEMBER
    #: ``replace``: the voter the new learner will replace
    replaces: int = NO_MEMBER
    incarnation: int = 1
    info: str = ""


def encode_change(change: Change) -> bytes:
    body = {"kind": change.kind, "member": change.member, "replaces": change.replaces,
            "incarnation": change.incarnation, "info": change.info}
    return MEMBER_OP + json.dumps(body, sort_keys=True, separators=(",", ":")).encode()


def decode_change(op: bytes) -> Change | None:
    """The change an op carries, None if it is no membership op; a malformed one decodes to a
    change of kind "" (refused when applied, like any impossible change)."""
    if not op.startswith(MEMBER_OP):
        return None
    try:
        body = json.loads(op[len(MEMBER_OP):])
    except ValueError:
        return Change("")
    match body:
        case {"kind": str(kind), "member": int(member), "replaces": int(replaces),
              "incarnation": int(incarnation), "info": str(info)} if (
            kind in KINDS and NO_MEMBER <= member <= MAX_MEMBER_ID
            and NO_MEMBER <= replaces <= MAX_MEMBER_ID and 1 <= incarnation <= MAX_MEMBER_ID
            and len(info.encode()) <= MAX_INFO_BYTES
        ):
            return Change(kind, member, replaces, incarnation, info)
    return Change("")


def apply_change(config: Configuration, change: Change) -> tuple[Configuration, str]:
    """The configuration after ``change`` and what to tell its client: ``"ok ..."``, or
    ``"refused: why"`` with ``config`` unchanged. A voter change leaves ``pending`` set: the
    epoch closes, and ``next_epoch`` makes the next one."""
    if change.kind not in KINDS:
        return config, "refused: not a membership change (malformed)"
    if change.kind == PUBLISH:
        return _publish(config, change)
    if config.closing:
        return config, "refused: a membership change is under way; one change at a time"
    if change.kind in (ADD, REPLACE):
        if config.learners:
            return config, "refused: a learner is catching up; one change at a time"
        return _add(config, change)
    target = config.member(change.member)
    if target is None:
        return config, f"refused: {change.member} is not a member"
    if change.kind == PROMOTE:
        if target.voter:
            return config, f"refused: {change.member} is a voter already"
        return (replace(config, closing=PROMOTE, closing_member=target.id),
                f"ok: promoting {target.id} (the epoch closes)")
    if not target.voter:  # remove a learner at once (it cancels its change)
        members = tuple(m for m in config.members if m.id != target.id)
        return replace(config, members=members), f"ok: learner {target.id} removed"
    if config.learners:
        return config, "refused: a learner is catching up; one change at a time"
    if len(config.voters) == 1:
        return config, "refused: the last voter cannot be removed"
    return (replace(config, closing=REMOVE, closing_member=target.id),
            f"ok: removing voter {target.id} (the epoch closes)")


def _publish(config: Configuration, change: Change) -> tuple[Configuration, str]:
    target = config.member(change.member)
    if target is None:
        return config, f"refused: {change.member} is not a member"
    if target.info == change.info:
        return config, f"ok: member {target.id}'s info is unchanged"
    members = tuple(replace(m, info=change.info) if m.id == target.id else m
                    for m in config.members)
    return replace(config, members=members), f"ok: member {target.id} published its info"


def _add(config: Configuration, change: Change) -> tuple[Configuration, str]:
    wanted = change.member
    if wanted != NO_MEMBER and wanted < config.next_id:
        return config, f"refused: id {wanted} is or was a member (ids are never reused)"
    if change.kind == REPLACE:
        old = config.member(change.replaces)
        if old is None or not old.voter:
            return config, f"refused: {change.replaces} is not a voter"
    new_id = config.next_id if wanted == NO_MEMBER else wanted
    learner = Member(new_id, change.incarnation, False, change.info,
                     change.replaces if change.kind == REPLACE else NO_MEMBER)
    members = tuple(sorted((*config.members, learner), key=lambda m: m.id))
    what = f" to replace {change.replaces}" if change.kind == REPLACE else ""
    return (replace(config, members=members, next_id=new_id + 1),
            f"ok: {new_id} added as a learner{what}")


def next_epoch(config: Configuration, seal_slot: int) -> Configuration:
    """The configuration after the epoch that its ``closing`` change closed at global slot
    ``seal_slot``."""
    promoted = config.member(config.closing_member) if config.closing == PROMOTE else None
    leaving = {config.closing_member} if config.closing == REMOVE else set()
    if promoted is not None and promoted.replaces != NO_MEMBER:
        leaving.add(promoted.replaces)
    voters = [v for v in config.voters if v not in leaving]
    if promoted is not None:
        voters.append(promoted.id)
    members = tuple(
        Member(m.id, m.incarnation, True, m.info) if promoted is not None and m.id == promoted.id
        else m
        for m in config.members if m.id not in leaving
    )
    return Configuration(epoch=config.epoch + 1, base=seal_slot + 1, voters=tuple(voters),
                         members=members, next_id=config.next_id)
