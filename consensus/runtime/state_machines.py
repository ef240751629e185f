"""The replicated state machines by kind: what a cluster file's ``[state_machine] kind`` chooses.

A kind is a ``StateMachineKind`` object: it reads its own keys of the ``[state_machine]``
table, builds the state machine a replica applies commands to, may serve something beside the
replica (on the replica's ``grpc_address``), may add options to ``sdpaxos cluster init``, and
may add metrics of its own to the replica's ``/metrics`` (``metrics``: plain ``StateMetric``
values, so a kind needs no metrics library and ``consensus`` knows nothing of what they count),
says what a snapshot of its state holds (``describe_state``: ``sdpaxos snapshot status``),
seeds a new cluster from a backup (``seed``: ``sdpaxos snapshot restore``) and judges the
principal a client certificate is issued for (``check_principal``: ``sdpaxos cert issue``).
``consensus`` names none but its own: ``kv`` (``consensus.statemachine.KVStore``) is built in,
and any installed distribution adds kinds through the ``sdpaxos.state_machines`` entry point
group (``name = "module:object"`` in its pyproject.toml), as this project's replicated
allocation store does. A kind's module is imported when the kind is first used (a
cluster file of the built-in kind imports no other), once per process.
"""

from __future__ import annotations

import argparse
import functools
import importlib
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final, Literal, Protocol

from consensus.errors import ConfigError
from consensus.statemachine import KVStore, StateMachine

if TYPE_CHECKING:
    from consensus.auth import Principal
    from consensus.runtime.cluster_config import ClusterConfig
    from consensus.runtime.node import ReplicaNode

__all__ = [
    "DEFAULT_KIND",
    "ENTRY_POINT_GROUP",
    "InitChoice",
    "InitFile",
    "MetricsSource",
    "Seed",
    "Service",
    "StateMachineKind",
    "StateMetric",
    "grpc_requirement",
    "kinds",
    "parse_state_machine_table",
    "state_machine_kind",
]

#: the entry point group other distributions register their kinds in
ENTRY_POINT_GROUP: Final = "sdpaxos.state_machines"

#: the kind of a cluster file without ``[state_machine] kind``
DEFAULT_KIND: Final = "kv"

#: the built-in kinds, name -> "module:object" (the same as this project's entry points, so a
#: source tree that was never installed still runs the key-value store)
BUILT_IN: Final[Mapping[str, str]] = MappingProxyType(
    {DEFAULT_KIND: "consensus.runtime.state_machines:KV_KIND"}
)


class Service(Protocol):
    """Something a kind serves beside a replica (a gRPC server, say), stopped with it."""

    async def stop(self) -> None: ...


@dataclass(frozen=True, slots=True, kw_only=True)
class InitFile:
    """A file ``cluster init`` writes beside the cluster file for a kind."""

    text: str
    #: printed after "wrote PATH": what it holds
    about: str = ""


@dataclass(frozen=True, slots=True, kw_only=True)
class InitChoice:
    """What ``sdpaxos cluster init`` writes for a kind the user chose with its options."""

    #: the ``[state_machine]`` table's keys besides ``kind`` (string values)
    table: Mapping[str, str] = field(default_factory=dict)
    #: give every replica a ``grpc_address`` (the kind serves gRPC)
    grpc: bool = False
    #: printed after the cluster file was written: how to use what it serves
    hint: str = ""
    #: files to write beside the cluster file (relative name -> file): written by ``cluster
    #: init`` with the cluster file, never before everything was checked
    files: Mapping[str, InitFile] = field(default_factory=dict)


@dataclass(frozen=True, slots=True, kw_only=True)
class Seed:
    """What ``sdpaxos snapshot restore`` seeds a new cluster with (``StateMachineKind.seed``)."""

    #: the new cluster file's ``[state_machine]`` choice (its table, files, gRPC)
    choice: InitChoice
    #: the state machine's snapshot the new log begins with
    state: bytes
    #: what the seed changes in the backup's state, one line each (say, a configuration
    #: change's outcome for every group it touches)
    changes: tuple[str, ...] = ()
    #: the subset of ``changes`` that loses work: refused unless the operator allows it
    losses: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True, kw_only=True)
class StateMetric:
    """One metric family a kind adds to a replica's ``/metrics``: its full name (a counter's
    without ``_total``, which the exposition adds), its HELP text, and one value per
    combination of label values (in the order of ``labels``)."""

    name: str
    help: str
    type: Literal["gauge", "counter"]
    labels: tuple[str, ...] = ()
    samples: Sequence[tuple[tuple[str, ...], float]] = ()


class MetricsSource(Protocol):
    """What a kind's ``metrics`` returns: asked for the current values at every scrape (on
    the event loop: keep it cheap, O(what it reports))."""

    def collect(self) -> Iterable[StateMetric]: ...


class StateMachineKind:
    """A kind of replicated state machine; subclasses override what they need."""

    #: the ``[state_machine] kind`` value (and the entry point's name)
    name: str = ""
    #: the ``[state_machine]`` keys this kind reads besides ``kind``
    option_keys: frozenset[str] = frozenset()
    #: what a replica's ``grpc_address`` serves under this kind; "": it serves no gRPC
    grpc_service: str = ""

    def parse_options(self, table: Mapping[str, Any], base: Path) -> Mapping[str, Any]:
        """This kind's options from its ``[state_machine]`` table (holding only its own keys
        and ``kind``); paths relative to ``base``, the cluster file's directory. A bad value
        is a ``ConfigError`` naming its key."""
        return MappingProxyType({})

    def build(self, config: ClusterConfig) -> StateMachine:
        """A fresh state machine for a replica of ``config`` (``ConfigError`` when a file it
        names is missing or bad)."""
        raise NotImplementedError

    async def serve(self, node: ReplicaNode, config: ClusterConfig, me: int) -> Service | None:
        """Start serving beside replica ``me`` (its node started); None: nothing to serve."""
        return None

    def metrics(self, node: ReplicaNode) -> MetricsSource | None:
        """The metrics this kind adds to ``node``'s ``/metrics`` (None: none). Called once
        per node, before it starts, so the source may count applied commands from the first
        one (``node.on_apply``; a restart's replay included)."""
        return None

    def add_init_arguments(self, parser: argparse.ArgumentParser) -> None:
        """Add this kind's options to ``sdpaxos cluster init``."""

    def init_choice(self, args: argparse.Namespace, cluster_file: Path) -> InitChoice | None:
        """What ``cluster init`` writes when its options chose this kind (None: they did
        not). Writes nothing itself (the files it needs go in ``InitChoice.files``); a bad
        input is a ``ConfigError``."""
        return None

    def describe_state(self, state: bytes) -> Mapping[str, object]:
        """What a snapshot of this kind's state holds, for ``sdpaxos snapshot status``:
        its configuration and counts, by name (``ConfigError`` for bytes that do not
        load)."""
        return {}

    def seed(self, state: bytes, chosen: InitChoice | None, cluster_file: Path) -> Seed:
        """How ``snapshot restore`` seeds a new cluster with ``state`` (a backup of this
        kind): by default with the backup's own configuration; ``chosen`` is what the
        operator's ``init`` options chose instead (None: none given). Writes nothing;
        ``ConfigError`` for a state or choice that cannot be seeded."""
        return Seed(choice=chosen or InitChoice(), state=state)

    def check_principal(self, principal: Principal, config: ClusterConfig) -> None:
        """``ConfigError`` if a client certificate for ``principal`` would name what the
        cluster of ``config`` does not have (``sdpaxos cert issue``)."""


class _KVKind(StateMachineKind):
    name = DEFAULT_KIND

    def build(self, config: ClusterConfig) -> StateMachine:
        return KVStore()

    def describe_state(self, state: bytes) -> Mapping[str, object]:
        store = KVStore()
        try:
            store.restore(state)
        except (ValueError, TypeError) as exc:
            raise ConfigError(f"not a key-value store snapshot: {exc}") from None
        return {"keys": len(store.data)}

    def metrics(self, node: ReplicaNode) -> MetricsSource | None:
        machine = node.state_machine
        return _KVMetrics(machine) if isinstance(machine, KVStore) else None


class _KVMetrics:
    __slots__ = ("_store",)

    def __init__(self, store: KVStore) -> None:
        self._store = store

    def collect(self) -> Iterable[StateMetric]:
        yield StateMetric(name="sdpaxos_kv_keys", type="gauge",
                          help="Keys the key-value store holds at this replica.",
                          samples=(((), len(self._store.data)),))


#: the built-in key-value store
KV_KIND: Final = _KVKind()


@functools.cache
def _targets() -> Mapping[str, str]:
    """Every kind's name -> "module:object", built-in first, then the installed ones by name
    (read from the installed distributions' metadata: nothing is imported)."""
    targets = dict(BUILT_IN)
    found: dict[str, str] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        known = targets.get(point.name, found.get(point.name))
        if known is not None and known != point.value:
            raise ConfigError(f"two state machines are installed as kind {point.name!r}: "
                              f"{known} and {point.value}")
        found[point.name] = point.value
    targets.update(sorted(found.items()))
    return MappingProxyType(targets)


@functools.cache
def _load(name: str) -> StateMachineKind:
    target = _targets()[name]
    module_name, _, attribute = target.partition(":")
    try:
        kind = getattr(importlib.import_module(module_name), attribute)
    except (ImportError, AttributeError) as exc:
        raise ConfigError(f"state machine kind {name!r} ({target}) cannot be loaded: "
                          f"{exc}") from None
    if not isinstance(kind, StateMachineKind) or kind.name != name:
        raise ConfigError(f"state machine kind {name!r} ({target}) is not a "
                          f"StateMachineKind named {name!r}")
    return kind


def kinds() -> Mapping[str, StateMachineKind]:
    """Every kind, loaded: the built-in ones first, then the installed ones by name."""
    return MappingProxyType({name: _load(name) for name in _targets()})


def state_machine_kind(name: str) -> StateMachineKind:
    """The kind called ``name`` (loaded on first use); ``ConfigError`` listing the known
    ones otherwise."""
    if name not in _targets():
        raise ConfigError(f"[state_machine].kind must be {_choices(_targets())}, got {name!r}")
    return _load(name)


def parse_state_machine_table(table: Any, base: Path) -> tuple[str, Mapping[str, Any]]:
    """``(kind, options)`` of a cluster file's ``[state_machine]`` table; ``ConfigError``
    for a bad table (a key no kind reads, a key of another kind, an unknown kind, a bad
    value). Other kinds are loaded only to judge a key the chosen one does not read."""
    if not isinstance(table, dict):
        raise ConfigError("[state_machine] must be a table")
    name = table.get("kind", DEFAULT_KIND)
    chosen = (
        state_machine_kind(name) if isinstance(name, str) and name in _targets() else None
    )
    foreign = set(table) - {"kind"} - (chosen.option_keys if chosen is not None else set())
    owners: dict[str, list[str]] = {}
    if foreign:
        for kind in kinds().values():
            for key in foreign & kind.option_keys:
                owners.setdefault(key, []).append(kind.name)
    unknown = sorted(foreign - set(owners))
    if unknown:
        raise ConfigError(f"[state_machine]: unknown keys {unknown}")
    if chosen is None:
        raise ConfigError(f"[state_machine].kind must be {_choices(_targets())}, got {name!r}")
    if owners:
        key = min(owners)
        raise ConfigError(f"[state_machine].{key} is only for kind = "
                          + " or ".join(f'"{owner}"' for owner in owners[key]))
    return chosen.name, chosen.parse_options(MappingProxyType(table), base)


def grpc_requirement() -> str:
    """Why a replica's ``grpc_address`` needs another kind: the message of that error."""
    serving = [kind for kind in kinds().values() if kind.grpc_service]
    if len(serving) == 1:
        return (f"grpc_address serves {serving[0].grpc_service}: it needs [state_machine] "
                f'kind = "{serving[0].name}"')
    if not serving:
        return "grpc_address needs a [state_machine] kind that serves gRPC; none is installed"
    return ("grpc_address needs a [state_machine] kind that serves gRPC: "
            + _choices({kind.name: kind for kind in serving}))


def _choices(known: Mapping[str, object]) -> str:
    """``"kv", "a" or "b"``: the kinds to choose from, built-in first."""
    names = [f'"{name}"' for name in known]
    return names[0] if len(names) == 1 else ", ".join(names[:-1]) + " or " + names[-1]
