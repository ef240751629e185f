"""Where a member runs, as the log records it: ``MemberInfo`` is the ``info`` string of a
membership change (``consensus.protocol.membership``), JSON of the addresses and the site a
new member's cluster-file entry would hold. The protocol keeps it opaque; the node reads it to
connect to a member that joined (``ReplicaNode._members_changed``) and ``sdpaxos member list``
to show it."""

from __future__ import annotations

import json
from dataclasses import dataclass

from consensus.errors import ConfigError
from consensus.protocol.membership.config import MAX_INFO_BYTES
from consensus.runtime.cluster_config import ReplicaSpec, parse_address

__all__ = ["MemberInfo", "info_of_spec", "parse_member_info"]


@dataclass(frozen=True, slots=True)
class MemberInfo:
    address: tuple[str, int]
    client_address: tuple[str, int]
    site: str

    def encode(self) -> str:
        text = json.dumps({"address": _text(self.address),
                           "client_address": _text(self.client_address), "site": self.site},
                          sort_keys=True, separators=(",", ":"))
        if len(text.encode()) > MAX_INFO_BYTES:
            raise ConfigError(f"member info over {MAX_INFO_BYTES} bytes: {text[:80]}...")
        return text


def info_of_spec(spec: ReplicaSpec) -> MemberInfo:
    return MemberInfo(spec.address, spec.client_address, spec.site)


def parse_member_info(text: str) -> MemberInfo | None:
    """The info a change carried, or None if it is none (bootstrap members carry none)."""
    try:
        raw = json.loads(text)
        return MemberInfo(parse_address(raw["address"], "address"),
                          parse_address(raw["client_address"], "client_address"),
                          str(raw["site"]))
    except (ValueError, KeyError, TypeError, ConfigError):
        return None


def _text(address: tuple[str, int]) -> str:
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"
