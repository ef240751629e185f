"""Where members run, as the log records it.

``MemberInfo`` is the ``info`` string of a member (``consensus.protocol.membership``): JSON of
the addresses (peer, client, and the optional gRPC and metrics ones) and the site its
cluster-file entry holds. A member added with ``sdpaxos member add`` carries it from its
``add`` change; every member publishes its own from its cluster-file entry once it votes (a
``publish`` change, ``MemberReplica._maybe_publish``), so the members a cluster started with
are in the log too, and one restarted on new addresses corrects the log.

``KnownMember`` is one row of a replica's member list (``consensus.runtime.status``): the
log's info, or, for a member that has published nothing yet, its entry in the answering
replica's cluster file (``published`` says which). Every client learns the members from it
(``Client.sync``, ``sdpaxos endpoint --cluster``, ``sdpaxos member list``, ``sdpaxos ctl``
through the gRPC ``ListMembers``), as etcd clients sync their endpoints from ``MemberList``.
The protocol keeps ``info`` opaque; the node reads it to connect to members
(``TurnLoop._members_changed``, ``consensus.runtime.turns``).
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from consensus.errors import ConfigError, DecodeError
from consensus.protocol.membership.config import MAX_INFO_BYTES, Configuration
from consensus.runtime.cluster_config import ReplicaSpec, parse_address

__all__ = [
    "KnownMember",
    "MemberInfo",
    "address_text",
    "info_of_spec",
    "known_members",
    "members_of_status",
    "parse_member_info",
]


def address_text(address: tuple[str, int]) -> str:
    """``("::1", 7100)`` -> ``"[::1]:7100"``."""
    host, port = address
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def _optional(text: Any, what: str) -> tuple[str, int] | None:
    return None if text is None else parse_address(str(text), what)


@dataclass(frozen=True, slots=True)
class MemberInfo:
    address: tuple[str, int]
    client_address: tuple[str, int]
    site: str
    grpc_address: tuple[str, int] | None = None
    metrics_address: tuple[str, int] | None = None

    def encode(self) -> str:
        body: dict[str, str] = {"address": address_text(self.address),
                                "client_address": address_text(self.client_address),
                                "site": self.site}
        if self.grpc_address is not None:
            body["grpc_address"] = address_text(self.grpc_address)
        if self.metrics_address is not None:
            body["metrics_address"] = address_text(self.metrics_address)
        text = json.dumps(body, sort_keys=True, separators=(",", ":"))
        if len(text.encode()) > MAX_INFO_BYTES:
            raise ConfigError(f"member info over {MAX_INFO_BYTES} bytes: {text[:80]}...")
        return text


def info_of_spec(spec: ReplicaSpec) -> MemberInfo:
    return MemberInfo(spec.address, spec.client_address, spec.site, spec.grpc_address,
                      spec.metrics_address)


def parse_member_info(text: str) -> MemberInfo | None:
    """The info a change carried, or None if it is none (a cluster's first members carry
    none until they publish theirs). Infos written before the gRPC and metrics addresses
    were carried have neither."""
    try:
        raw = json.loads(text)
        return MemberInfo(parse_address(raw["address"], "address"),
                          parse_address(raw["client_address"], "client_address"),
                          str(raw["site"]), _optional(raw.get("grpc_address"), "grpc_address"),
                          _optional(raw.get("metrics_address"), "metrics_address"))
    except (ValueError, KeyError, TypeError, AttributeError, ConfigError):
        return None


@dataclass(frozen=True, slots=True)
class KnownMember:
    """A member and where it runs (``info``: None if neither the log nor the answering
    replica's cluster file says); ``published``: the info is the log's."""

    id: int
    incarnation: int
    voter: bool
    info: MemberInfo | None
    published: bool

    def to_status(self) -> dict[str, Any]:
        info = self.info

        def text(address: tuple[str, int] | None) -> str | None:
            return None if address is None else address_text(address)

        return {
            "id": self.id, "incarnation": self.incarnation, "voter": self.voter,
            "published": self.published, "site": info.site if info else "",
            "address": text(info.address) if info else None,
            "client_address": text(info.client_address) if info else None,
            "grpc_address": text(info.grpc_address) if info else None,
            "metrics_address": text(info.metrics_address) if info else None,
        }

    @classmethod
    def from_status(cls, row: Any) -> KnownMember:
        """A row of a status answer's member list (``DecodeError`` if it is not one: a
        peer never crashes a tool)."""
        try:
            client = row["client_address"]
            info = None if client is None else MemberInfo(
                parse_address(row["address"], "address"), parse_address(client, "client"),
                str(row["site"]), _optional(row.get("grpc_address"), "grpc_address"),
                _optional(row.get("metrics_address"), "metrics_address"))
            member_id, incarnation = row["id"], row["incarnation"]
            if type(member_id) is not int or type(incarnation) is not int:
                raise TypeError("id and incarnation must be integers")
            return cls(member_id, incarnation, bool(row["voter"]), info,
                       bool(row["published"]))
        except (KeyError, TypeError, AttributeError, ConfigError) as exc:
            raise DecodeError(f"a replica listed a malformed member {row!r}: {exc}") from None


def known_members(config: Configuration, files: Mapping[int, ReplicaSpec]) -> list[KnownMember]:
    """The members of ``config`` (the log's), voters first in core order (the sequencer of
    the epoch's first view first), then learners; where each runs from the log, else from
    ``files`` (this replica's cluster file, by id)."""
    order = {voter: position for position, voter in enumerate(config.voters)}
    rows = []
    for member in sorted(config.members, key=lambda m: (order.get(m.id, len(order)), m.id)):
        info = parse_member_info(member.info)
        published = info is not None
        if info is None and member.id in files:
            info = info_of_spec(files[member.id])
        rows.append(KnownMember(member.id, member.incarnation, member.voter, info, published))
    return rows


def members_of_status(status: Mapping[str, Any]) -> list[KnownMember] | None:
    """The member list of a status answer (``consensus.runtime.status``), None if the
    replica's core has no membership (its members are its cluster file's: the answer's
    ``members``). ``DecodeError`` if it is malformed."""
    membership = status.get("membership")
    if membership is None:
        return None
    if not isinstance(membership, Mapping) or not isinstance(membership.get("members"), list):
        raise DecodeError(f"a replica answered a malformed membership: {membership!r}")
    return [KnownMember.from_status(row) for row in membership["members"]]
