"""Protocol configuration shared by every core, and the paper's wide-area sites.

All intervals are integers in microseconds: the cores never read a clock, the driver (or the
simulator) passes ``now`` in.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Final

from consensus.errors import ConfigError

__all__ = ["PAPER_RTT_MS", "SITES", "ProtocolConfig", "site_rtt_ms"]

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


@dataclass(frozen=True, slots=True, kw_only=True)
class ProtocolConfig:
    """Settings every replica of a cluster must agree on, plus local tuning knobs."""

    #: number of replicas N = 2F + 1; ids are 0..N-1
    replicas: int
    #: most commands batched into one C-instance
    max_batch: int = 1024
    #: resend an unacknowledged CAccept / CRequest after this long
    retransmit_us: int = 200_000
    #: a replica that cannot execute its next slot for this long asks a peer (Catchup)
    catchup_us: int = 300_000
    #: send CAccepts to a bare majority only (plus a CRequest when the sequencer is not in it)
    thrifty: bool = False
    #: peers in order of preference for thrifty quorums, per replica (nearest first);
    #: empty means "by id distance"
    preference: tuple[tuple[int, ...], ...] = ()

    def __post_init__(self) -> None:
        if self.replicas < 1 or self.replicas % 2 == 0:
            raise ConfigError(f"replicas must be odd and positive (2F+1), got {self.replicas}")
        if self.max_batch < 1:
            raise ConfigError(f"max_batch must be >= 1, got {self.max_batch}")
        for name in ("retransmit_us", "catchup_us"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"{name} must be positive, got {getattr(self, name)}")
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
