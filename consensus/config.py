"""Protocol configuration shared by every core, and the paper's wide-area sites.

All intervals are integers in microseconds: the cores never read a clock, the driver (or the
simulator) passes ``now`` in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from consensus.errors import ConfigError

__all__ = ["PAPER_RTT_MS", "SITES", "UNSAFE_VARIANTS", "ProtocolConfig", "site_rtt_ms"]

#: Replica ``i`` sits at ``SITES[i]`` in the paper's deployment (§5).
SITES: Final = ("CA", "OR", "OH", "IRE", "SEL")

#: Round-trip times between the paper's sites, in milliseconds (SoCC'18, Table 1).
PAPER_RTT_MS: Final[dict[frozenset[str], float]] = {
    frozenset(("CA", "OR")): 20,
    frozenset(("CA", "OH")): 52,
    frozenset(("CA", "IRE")): 139,
    frozenset(("CA", "SEL")): 146,
    frozenset(("OR", "OH")): 68,
    frozenset(("OR", "IRE")): 125,
    frozenset(("OR", "SEL")): 133,
    frozenset(("OH", "IRE")): 84,
    frozenset(("OH", "SEL")): 197,
    frozenset(("IRE", "SEL")): 229,
}


def site_rtt_ms(a: str, b: str) -> float:
    """RTT between two of the paper's sites (0 for a site and itself)."""
    if a == b:
        return 0.0
    try:
        return PAPER_RTT_MS[frozenset((a, b))]
    except KeyError:
        raise ConfigError(f"no RTT known between sites {a!r} and {b!r}") from None


#: Deliberately broken protocol variants, for tests that prove the simulator catches them.
#: Never set outside tests.
UNSAFE_VARIANTS: Final = frozenset(
    {
        "no_hole_filling",  # N=5 view change fills holes with NO_CL only (Figure 7 removed)
        "ack_before_persist",  # acknowledgements leave before their records are durable
        "no_lease_check",  # the sequencer answers reads without a majority of leases
        "go_ready_rule",  # N=5 sequencer is ready before any OAck (the Go prototype's rule)
        "acks_any_ballot",  # N=5 learns a C-instance chosen from acknowledgements of any ballot
        "replay_accepted",  # a restart also executes what it accepted, as if it were chosen
        "epaxos_exec_uncommitted",  # EPaxos runs an instance before its dependencies commit
        "epaxos_try_ignores_conflicts",  # EPaxos pre-accepts every TryPreAccept unchecked
        "epaxos_recovery_ignores_preaccepted",  # EPaxos recovery drops pre-accepted replies
        "takeover_ignores_accepted",  # a baseline takeover/revocation drops accepted values
        # membership: the new members take over at the change's own slot, no SEAL (what the
        # old epoch's quorum ordered after it, and may have acknowledged, is dropped)
        "epoch_at_change",
        # a command whose instance was recovered without it fails *definitely*, though a
        # client retry may carry it elsewhere (what the cores did before issue 39) ...
        "definite_recovered",
        # ... and a client takes a definite failure for the request's end even after an
        # earlier attempt whose outcome it never learned (``consensus.attempts``)
        "trust_definite",
        # membership: a message of a later epoch moves a member on, on one peer's word (it
        # retires its core and learns as a learner until the next epoch)
        "trust_epoch_claims",
        # N=5 view change: the hole filling counts the untraced replica's slots below the
        # candidacy's start from the candidate's counts when the votes are in (a snapshot
        # installed meanwhile moved them on: chosen slots of that replica were given away)
        "candidacy_counts_now",
        # a serving sequencer that installed a snapshot past the slots it assigned (it was
        # succeeded while cut off) keeps serving: it assigns slots the log already executed
        "stale_sequencer_orders",
        # membership: installing a snapshot of a later epoch keeps the probe for the end of
        # the epoch before: its answer holds the SEAL that began the new one, taken for
        # the new one's end (a voter retires the core of the epoch it serves, and the epoch
        # may never have a quorum again)
        "probe_survives_snapshot",
        # membership: a learner's snapshot past its epoch's base claims zero C-instances per
        # owner, and a voter of that epoch installs it (executing older instances again)
        "learner_counts_zero",
        # membership: a voter promoted from learner whose core a peer's snapshot started
        # still waits for its own snapshot, and then starts its core again from nothing (it
        # forgets what it accepted and executed in the epoch)
        "stale_awaiting_core",
        # membership: the records a same-epoch snapshot installation rewrites the log with
        # lack the epoch's configuration: a restart reads them as epoch 0's and starts the
        # voter's core of the epoch from nothing (its promises and accepted NewView lost)
        "snapshot_log_unmarked",
        # membership: a sealed sequencer ignores a CRequest for an instance it can no longer
        # order, though the owner's lower instances' OAccepts may be what it lost (the slot
        # before the SEAL stays unchosen, the epoch never ends)
        "sealed_ignores_crequest",
        # sessions (``consensus.sessions``): an evicted session is forgotten (no tombstone, no
        # open-by rule), so a late copy of a request it ran runs again
        "sessions_forget_evicted",
        # membership: a member sets its own published info (addresses) in its own
        # configuration instead of proposing it through the log (the members disagree)
        "publish_local",
        # a restart ignores its reservation (``ReserveRecord``): it proposes again at an index
        # whose CAccept left before the previous incarnation's record of it was durable
        "reuse_index",
        # a replica counts a proposer's (or sequencer's) acceptance from its Accept, which may
        # have left before that acceptance was durable (the rule before Accepts left early)
        "learn_from_accept",
        # a sequencer never re-sends an owner's unchosen O-instance to the owner itself: one
        # whose OAccept the owner lost stays unchosen once later ones make the owner's
        # instance ready (the count rule), with the third of three replicas down for good
        "resend_skips_owner",
        # membership: a snapshot installed in the turn that took an ended epoch's last slots
        # from its core (or a learner's learned ones) leaves them to be applied on top of it
        # (they ran twice)
        "apply_covered",
    }
)


@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolConfig:
    """Settings every replica of a cluster must agree on, plus local tuning knobs."""

    #: number of replicas N (= 2F + 1 at bootstrap; a membership epoch may have any N >= 1,
    #: quorum = majority); ids are 0..N-1
    replicas: int
    #: most commands batched into one C-instance (or slot, in the baselines)
    max_batch: int = 1024
    #: most bytes of commands (``Command.size``) in one batch; a larger command goes alone.
    #: Together with the codec's per-command limits it keeps every message below a frame.
    max_batch_bytes: int = 1 << 20
    #: resend an unacknowledged CAccept / CRequest after this long
    retransmit_us: int = 200_000
    #: a replica that cannot execute its next slot for this long asks a peer (Catchup)
    catchup_us: int = 300_000
    #: send CAccepts to a bare majority only (plus a CRequest when the sequencer is not in it)
    thrifty: bool = False
    #: peers in order of preference for thrifty quorums, per replica (nearest first);
    #: empty means "by id distance"
    preference: tuple[tuple[int, ...], ...] = ()
    #: every replica sends a heartbeat to every other this often
    heartbeat_us: int = 50_000
    #: a peer not heard from for this long is suspected; the sequencer's suspicion is
    #: randomized in [1, 1.5) times this to spread candidates apart
    election_timeout_us: int = 300_000
    #: a sequencer lease lasts this long from the grant (the granter's clock)
    lease_us: int = 250_000
    #: bound on how much faster or slower any replica's clock runs, parts per million
    max_drift_ppm: int = 10_000
    #: straggler detection: the window over which a replica compares the O-instances it got
    #: with the C-instances it needed ordered, and how many slow windows in a row make it
    #: suspect the sequencer; 0 windows turns detection off
    straggler_window_us: int = 500_000
    straggler_windows: int = 3
    #: no straggler-triggered view change within this long of the last view change
    straggler_cooldown_us: int = 5_000_000
    #: Multi-Paxos only: the stable leader's replica id (the other protocols ignore it)
    leader: int = 0
    #: test-only broken variants (see ``UNSAFE_VARIANTS``)
    unsafe: frozenset[str] = frozenset()

    def __post_init__(self) -> None:
        if self.replicas < 1:
            raise ConfigError(f"replicas must be positive, got {self.replicas}")
        if not 1 <= self.max_batch <= 65536:
            raise ConfigError(f"max_batch must be in 1..65536, got {self.max_batch}")
        if not 1 <= self.max_batch_bytes <= 8 << 20:
            raise ConfigError(
                f"max_batch_bytes must be in 1..{8 << 20}, got {self.max_batch_bytes}"
            )
        for name in (
            "retransmit_us",
            "catchup_us",
            "heartbeat_us",
            "election_timeout_us",
            "lease_us",
            "straggler_window_us",
        ):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
        if self.lease_us > self.election_timeout_us:
            raise ConfigError(
                f"lease_us ({self.lease_us}) must not exceed election_timeout_us "
                f"({self.election_timeout_us}): a granted lease would outlive the suspicion"
            )
        if not 0 <= self.max_drift_ppm < 500_000:
            raise ConfigError(f"max_drift_ppm must be in [0, 500000), got {self.max_drift_ppm}")
        if self.straggler_windows < 0:
            raise ConfigError("straggler_windows must be >= 0")
        if not 0 <= self.leader < self.replicas:
            raise ConfigError(f"leader must be a replica id in 0..{self.replicas - 1}")
        unknown = self.unsafe - UNSAFE_VARIANTS
        if unknown:
            raise ConfigError(f"unknown unsafe variants: {sorted(unknown)}")
        if self.preference:
            if len(self.preference) != self.replicas:
                raise ConfigError("preference needs one peer order per replica")
            for me, order in enumerate(self.preference):
                if sorted(order) != [r for r in range(self.replicas) if r != me]:
                    raise ConfigError(f"preference[{me}] must list every other replica once")

    @property
    def quorum(self) -> int:
        """Q = F + 1."""
        return self.replicas // 2 + 1

    def peers_by_preference(self, me: int) -> tuple[int, ...]:
        if self.preference:
            return self.preference[me]
        n = self.replicas
        return tuple(sorted((r for r in range(n) if r != me), key=lambda r: ((r - me) % n, r)))
