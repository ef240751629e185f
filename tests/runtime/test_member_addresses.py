"""Where members run (``consensus.runtime.members``) and the addresses ``sdpaxos member
add|replace`` hands a new member (``member_cli.assign_addresses``)."""

from __future__ import annotations

import tomllib
from pathlib import Path

import pytest

from consensus.errors import ConfigError, DecodeError
from consensus.protocol.membership.config import (
    ADD,
    PUBLISH,
    REMOVE,
    Change,
    apply_change,
    bootstrap,
    next_epoch,
)
from consensus.runtime.cli import cluster_toml
from consensus.runtime.cluster_config import parse_cluster_config
from consensus.runtime.member_cli import assign_addresses
from consensus.runtime.members import (
    KnownMember,
    MemberInfo,
    info_of_spec,
    known_members,
    members_of_status,
    parse_member_info,
)

BASE = 20_000


def laid_out(member_id: int, *, grpc: bool = True, metrics: bool = True,
             host: str = "127.0.0.1") -> MemberInfo:
    """Where ``cluster init --base-port BASE`` puts a replica."""
    return MemberInfo((host, BASE + member_id), (host, BASE + 100 + member_id), "CA",
                      (host, BASE + 300 + member_id) if grpc else None,
                      (host, BASE + 200 + member_id) if metrics else None)


def members(*ids: int, **layout: bool) -> list[KnownMember]:
    return [KnownMember(i, 1, True, laid_out(i, **layout), True) for i in ids]


def test_info_round_trips_and_older_infos_read_without_the_new_addresses() -> None:
    info = laid_out(3)
    assert parse_member_info(info.encode()) == info
    older = '{"address":"10.0.0.4:7003","client_address":"10.0.0.4:7103","site":"IRE"}'
    assert parse_member_info(older) == MemberInfo(("10.0.0.4", 7003), ("10.0.0.4", 7103), "IRE")
    v6 = MemberInfo(("::1", 7003), ("::1", 7103), "CA", ("::1", 7303))
    assert parse_member_info(v6.encode()) == v6 and "[::1]:7303" in v6.encode()
    for junk in ("", "{", "[]", '{"address":"x"}', '{"address":"h:1","client_address":"h:2",'
                 '"site":"s","grpc_address":"nope"}'):
        assert parse_member_info(junk) is None


def test_the_log_says_where_members_run_and_the_file_fills_in_until_they_publish() -> None:
    text = cluster_toml(3, BASE, wan=False)
    file = parse_cluster_config(tomllib.loads(text), base=Path("."), source="c.toml")
    files = {spec.id: spec for spec in file.replicas}
    config, _ = apply_change(bootstrap(3), Change(PUBLISH, 1, info=laid_out(1).encode()))
    config, _ = apply_change(config, Change(ADD, 3, info=laid_out(3).encode()))
    rows = known_members(config, files)
    assert [(m.id, m.voter, m.published) for m in rows] == [
        (0, True, False), (1, True, True), (2, True, False), (3, False, True)]
    # (the file's entries: no gRPC address, metrics at base + 200 + id)
    assert rows[0].info == info_of_spec(files[0]) and rows[3].info == laid_out(3)
    assert rows[0].info is not None and rows[0].info.metrics_address == ("127.0.0.1", BASE + 200)
    # a member the answering replica's file does not list, and that published nothing
    assert known_members(config, {})[0].info is None
    # voters first in the epoch's order (its sequencer first), then learners
    after = next_epoch(apply_change(bootstrap(3), Change(REMOVE, 0))[0], 9)
    after = apply_change(after, Change(ADD, 3))[0]
    assert [(m.id, m.voter) for m in known_members(after, files)] == [
        (1, True), (2, True), (3, False)]
    # what a status answer carries reads back the same
    status = {"membership": {"members": [m.to_status() for m in rows]}}
    assert members_of_status(status) == rows
    assert members_of_status({"membership": None}) is None
    with pytest.raises(DecodeError):
        members_of_status({"membership": {"members": [{"id": "zero"}]}})


def test_a_new_member_gets_the_next_ports_of_the_layout() -> None:
    assert assign_addresses(members(0, 1, 2), 3, "IRE", {}) == MemberInfo(
        ("127.0.0.1", BASE + 3), ("127.0.0.1", BASE + 103), "IRE", ("127.0.0.1", BASE + 303),
        ("127.0.0.1", BASE + 203))
    # ids with gaps (0 and 2 removed): still base + id
    assert assign_addresses(members(1, 3, 4), 5, "OH", {}).client_address == (
        "127.0.0.1", BASE + 105)
    # a kind no member has is left out (a cluster without gRPC)
    info = assign_addresses(members(0, 1, 2, grpc=False), 3, "IRE", {})
    assert info.grpc_address is None and info.metrics_address == ("127.0.0.1", BASE + 203)


def test_given_addresses_win_and_are_checked() -> None:
    given = {"address": ("10.0.0.9", 9000), "grpc_address": ("10.0.0.9", 9300)}
    info = assign_addresses(members(0, 1, 2), 3, "IRE", given)
    assert info.address == ("10.0.0.9", 9000) and info.grpc_address == ("10.0.0.9", 9300)
    assert info.client_address == ("127.0.0.1", BASE + 103)
    with pytest.raises(ConfigError, match=r"--client-address 127.0.0.1:20101 is a current "
                       "member's address already"):
        assign_addresses(members(0, 1, 2), 3, "IRE", {"client_address": ("127.0.0.1",
                                                                          BASE + 101)})


def test_a_layout_it_cannot_follow_asks_for_the_flag() -> None:
    odd = [*members(0, 1), KnownMember(2, 1, True, laid_out(2, host="10.0.0.2"), True)]
    with pytest.raises(ConfigError, match="not on one host at base \\+ id; give --address"):
        assign_addresses(odd, 3, "IRE", {})
    assert assign_addresses(odd, 3, "IRE", {
        "address": ("10.0.0.3", 1), "client_address": ("10.0.0.3", 2),
        "grpc_address": ("10.0.0.3", 3), "metrics_address": ("10.0.0.3", 4)}).site == "IRE"
    with pytest.raises(ConfigError, match="give --address"):  # no member to follow
        assign_addresses([], 3, "IRE", {})
