"""The GPU allocation store as a kind of replicated state machine: ``[state_machine] kind =
"cluster_state"`` in a cluster file.

``consensus`` knows nothing about GPUs: it finds this kind by name through the
``sdpaxos.state_machines`` entry point group (pyproject.toml; see
``consensus.runtime.state_machines``). Everything the store adds to a replica lives here:

* the cluster file: ``gpu_config``, the HiveD-style cluster YAML file (relative to the cluster
  file); a replica's ``grpc_address`` is accepted because this kind serves gRPC;
* ``sdpaxos serve``: the ``ClusterStore`` built from the configuration the log *began* with
  (below), and the allocation service (``cluster_state.grpc_api.service``) on the replica's
  ``grpc_address``, stopped with it;
* ``sdpaxos cluster init --gpu-store | --gpu-config FILE``: a generated or given GPU cluster
  and a ``grpc_address`` for every replica;
* ``sdpaxos snapshot restore``: a new cluster on the configuration the backup holds (written
  out as ``gpu.yaml``), or on another one given with the ``init`` options, which the backup's
  state is reconfigured to before it is seeded (``ops.reconfigure``, as ``sdpaxos ctl config
  apply`` would: the same report), refused when that drops or trims a group unless the
  operator allows it; ``sdpaxos snapshot status``: the configuration and counts a backup
  holds; ``sdpaxos cert issue``: a scheduler's virtual clusters must exist.

**The configuration a replica starts from.** Every replica must apply its log under the
configuration the log ran with, or one that executes its log again from the start after the
operator edited ``gpu_config`` would place groups on other GPUs than its peers did. So the
first start copies the configuration into the cluster's data directory, beside the replicas'
own directories (``START_CONFIG_NAME``: temp file, fsync, exclusive link, fsync of the
directory), and every start builds the store from that copy, never from the current file. The
copy is what the log began with: the current file for a data directory that starts empty;
for one seeded from a snapshot (a replica directory that already holds one when there is no
copy yet: data from before the copy was kept, or a snapshot put there by hand) the snapshot is
where its log begins, so the copy is the configuration that snapshot carries (format 2).
Restoring a snapshot adopts its own configuration anyway, so once a replica has one the copy
only matters to a replica that executes its log from slot 0. The copy is shared by the
replicas of a local cluster (one ``data_dir``) and kept by each one's volume in compose.

**A changed file is proposed through the log.** Once the node serves, a replica whose store
runs another configuration than the file's proposes ``ops.reconfigure(file text)`` through its
embedded client, retried until it applies (the others, restarted with the same file, propose
the same text: a configuration the store already runs answers ``changed: false`` and changes
no allocation). A file that does not load or validate is logged as an error and the replica
keeps serving the configuration its log runs: it never stops over it. The file is what a
restart applies: after ``sdpaxos ctl config apply FILE``, put FILE in ``gpu_config`` too, or
the next replica to restart proposes the older file again.

The store, its configuration and gRPC are imported when used: ``sdpaxos cluster`` loads every
installed kind to offer its ``init`` options.

``/metrics``: the store's per-VC GPU and group gauges and its preemption counters
(``cluster_state.metrics``).
"""

from __future__ import annotations

import argparse
import asyncio
import contextlib
import logging
import os
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from consensus.errors import ConfigError
from consensus.messages import Command
from consensus.runtime.cli import cluster_toml
from consensus.runtime.state_machines import (
    InitChoice,
    InitFile,
    MetricsSource,
    Seed,
    Service,
    StateMachineKind,
)

if TYPE_CHECKING:
    import grpc

    from cluster_state.config import ClusterConfig as GpuConfig
    from cluster_state.store import ClusterStore
    from consensus.auth import Principal
    from consensus.runtime.cluster_config import ClusterConfig
    from consensus.runtime.node import ReplicaNode

__all__ = [
    "CLUSTER_STATE",
    "NAME",
    "START_CONFIG_NAME",
    "ClusterStateKind",
    "gpu_config_path",
    "load_store",
    "start_config_path",
    "start_store",
    "store_cluster_toml",
    "store_table",
]

#: the ``[state_machine] kind`` (and entry point) name
NAME: Final = "cluster_state"

#: the ``[state_machine]`` key naming the GPU cluster file
GPU_CONFIG_KEY: Final = "gpu_config"

#: ``cluster init --gpu-store``: the generated file (beside the cluster file) and its shape
GENERATED_FILE: Final = "gpu.yaml"
GENERATED_NODES: Final = 64
GENERATED_VCS: Final = 4
GENERATED_PINNED: Final = 2

#: how long a stopping replica lets the gRPC calls in flight finish (seconds)
GRPC_STOP_GRACE_S: Final = 1.0

#: the copy of the GPU configuration the log began with, in the cluster's ``data_dir``
START_CONFIG_NAME: Final = "gpu-config.start.yaml"

#: a replica's snapshots, in its own directory (as ``consensus.runtime.node`` keeps them):
#: read at a first start to find the configuration of a data directory seeded from one
SNAPSHOTS_DIR_NAME: Final = "snapshots"

#: after a proposal of the file's configuration failed (no quorum yet while the other
#: replicas start, a failover), wait this long before the next one (seconds), doubled each
#: time up to the cap: the proposal is retried until it applies
RECONFIGURE_RETRY_S: Final = 0.2
RECONFIGURE_RETRY_MAX_S: Final = 5.0

_log = logging.getLogger("sdpaxos.serve")  # the replica's own logger: one stream of its events


class ClusterStateKind(StateMachineKind):
    name = NAME
    option_keys = frozenset({GPU_CONFIG_KEY})
    grpc_service = "the GPU allocation store"

    def parse_options(self, table: Mapping[str, Any], base: Path) -> Mapping[str, Any]:
        gpu = table.get(GPU_CONFIG_KEY)
        if not isinstance(gpu, str) or not gpu:
            raise ConfigError(f"[state_machine].{GPU_CONFIG_KEY} (the GPU cluster YAML file) "
                              "is required")
        path = Path(gpu)
        return MappingProxyType({GPU_CONFIG_KEY: path if path.is_absolute() else base / path})

    def build(self, config: ClusterConfig) -> ClusterStore:
        import gc

        from cluster_state.gc_pause import freeze, gc_paused

        gc.collect()  # what is garbage now is not frozen below (the heap is small yet)
        with gc_paused():
            store = start_store(config)
            if config.tls is not None:
                from cluster_state.authz import AuthorizedStore

                # a TLS cluster's store judges the principals its commands carry
                store = AuthorizedStore(store.topology)
            # A 100k-GPU store is millions of long-lived objects: out of the collector's
            # way for good, as the replica does with its logs once it serves (``gc.freeze``
            # also forgets the allocations counted meanwhile, so no pass over them follows)
            freeze()
        return store

    async def serve(self, node: ReplicaNode, config: ClusterConfig, me: int) -> Service | None:
        server = None
        address = config.replica(me).grpc_address
        if address is not None:
            from cluster_state.grpc_api.service import serve_grpc

            server = await serve_grpc(node, *address, tls=config.tls, me=me)
            _log.info("replica %d serving the allocation store over gRPC on %s:%d", me,
                      *address)
        # the file's configuration, proposed through the log if the store runs another one
        proposing = asyncio.create_task(
            _propose_file_config(node, gpu_config_path(config), me),
            name=f"reconfigure-{me}",
        )
        proposing.add_done_callback(_log_failure)
        return _StoreServices(server, proposing)

    def metrics(self, node: ReplicaNode) -> MetricsSource | None:
        """The store's gauges and counters (``cluster_state.metrics``)."""
        from cluster_state.metrics import StoreMetrics
        from cluster_state.store import ClusterStore

        if not isinstance(node.state_machine, ClusterStore):
            return None
        metrics = StoreMetrics(node.state_machine)
        node.on_apply.append(metrics.applied)
        return metrics

    def add_init_arguments(self, parser: argparse.ArgumentParser) -> None:
        store = parser.add_mutually_exclusive_group()
        store.add_argument(
            "--gpu-store",
            action="store_true",
            help="serve the GPU allocation store on a generated HiveD-style cluster "
            f"({GENERATED_FILE})",
        )
        store.add_argument(
            "--gpu-config",
            metavar="FILE",
            help="serve the GPU allocation store on this HiveD-style cluster file",
        )

    def init_choice(self, args: argparse.Namespace, cluster_file: Path) -> InitChoice | None:
        from cluster_state.config import load_config, synthetic_config
        from cluster_state.errors import ClusterStateError

        given: str | None = getattr(args, "gpu_config", None)
        files = {}
        if given is not None:
            try:  # refuse a bad file now rather than when the replicas start
                load_config(given)
            except OSError as exc:
                raise ConfigError(f"{given}: cannot read: {exc.strerror}") from None
            except ClusterStateError as exc:
                raise ConfigError(f"{given}: {exc}") from None
            gpu = str(Path(given).resolve())
        elif getattr(args, "gpu_store", False):
            gpu = GENERATED_FILE
            files[gpu] = InitFile(
                text=synthetic_config(nodes=GENERATED_NODES, vcs=GENERATED_VCS,
                                      pinned=GENERATED_PINNED).to_yaml(),
                about=f"{GENERATED_NODES} nodes x 8 GPUs, {GENERATED_VCS} virtual clusters")
        else:
            return None
        return _store_choice(gpu, cluster_file, files)

    def describe_state(self, state: bytes) -> Mapping[str, object]:
        store = _restored(state)
        summary = store.allocator.summary()
        topology = store.topology
        return {
            "configuration": f"{topology.digest.hex()[:12]} ({summary['nodes']} nodes, "
                             f"{sum(chain['leaves'] for chain in summary['chains'])} GPUs, "
                             f"virtual clusters {', '.join(summary['vcs']) or 'none'})",
            "revision": store.revision,
            "groups": summary["groups"],
            "preempting groups": summary["preempting"],
            "GPUs in use": sum(chain["guaranteed"] + chain["opportunistic"]
                               for chain in summary["chains"]),
            "bad nodes": len(summary["bad_nodes"]),
        }

    def seed(self, state: bytes, chosen: InitChoice | None, cluster_file: Path) -> Seed:
        from cluster_state.ops import reconfigure

        store = _restored(state)
        if chosen is None:  # the backup's own configuration, written out beside the file
            text = store.topology.config.to_yaml()
            about = f"the backup's GPU configuration, {store.topology.digest.hex()[:12]}"
            return Seed(choice=_store_choice(GENERATED_FILE, cluster_file,
                                             {GENERATED_FILE: InitFile(text=text, about=about)}),
                        state=state)
        gpu = chosen.table[GPU_CONFIG_KEY]
        given = chosen.files.get(gpu)
        try:
            text = given.text if given is not None else Path(gpu).read_text()
        except OSError as exc:
            raise ConfigError(f"{gpu}: {exc}") from None
        plan = store.plan_reconfiguration(text)
        if not plan.get("changed"):
            return Seed(choice=chosen, state=state)
        # Applied here as the log would apply it, so the new cluster begins with its
        # outcome and its replicas have no configuration of their file to propose.
        store.apply(store.revision + 1, Command(client_id=RESTORE_CLIENT_ID, seq=0,
                                                op=reconfigure(text), keys=(), blind=False))
        changes, losses = [], []
        for group, entry in sorted(plan.get("groups", {}).items()):
            line = _outcome(group, entry)
            changes.append(line)
            if entry.get("outcome") in LOSING_OUTCOMES:
                losses.append(line)
        changes.insert(0, f"configuration {store.topology.digest.hex()[:12]} from {gpu}")
        return Seed(choice=chosen, state=store.snapshot(), changes=tuple(changes),
                    losses=tuple(losses))

    def check_principal(self, principal: Principal, config: ClusterConfig) -> None:
        from cluster_state.config import load_config
        from cluster_state.errors import ClusterStateError

        if not principal.vcs:
            return
        path = gpu_config_path(config)
        try:
            known = {vc.name for vc in load_config(path).virtual_clusters}
        except (ClusterStateError, OSError) as exc:
            raise ConfigError(f"{path}: {exc}") from None
        missing = [vc for vc in principal.vcs if vc not in known]
        if missing:
            raise ConfigError(
                f"no virtual cluster {', '.join(missing)} in {path} (it has "
                f"{', '.join(sorted(known)) or 'none'}): a certificate for it would open "
                "nothing")


#: the outcomes of a reconfiguration that take GPUs from a group (``Allocator.reconfigured``)
LOSING_OUTCOMES: Final = frozenset({"dropped", "trimmed"})
#: the session a restore's reconfiguration is applied under (``seed``)
RESTORE_CLIENT_ID: Final = 1 << 44


def _store_choice(gpu: str, cluster_file: Path, files: Mapping[str, InitFile]) -> InitChoice:
    return InitChoice(
        table={GPU_CONFIG_KEY: gpu}, grpc=True, files=files,
        hint=f"the GPU allocation store: sdpaxos ctl --config {cluster_file} status",
    )


def _outcome(group: str, entry: Mapping[str, Any]) -> str:
    """One group's line of a reconfiguration report."""
    line = f"{group}: {entry.get('outcome')}"
    if entry.get("dropped"):
        line += f", {len(entry['dropped'])} GPUs gone ({', '.join(entry['dropped'][:4])}" + (
            ", ...)" if len(entry["dropped"]) > 4 else ")")
    if entry.get("moved_to"):
        line += f", moved {entry['moved_from']} -> {entry['moved_to']}"
    if entry.get("reason"):
        line += f" ({entry['reason']})"
    return line


def _restored(state: bytes) -> ClusterStore:
    """A store holding the snapshot ``state`` under the configuration it carries."""
    from cluster_state.config import synthetic_config
    from cluster_state.errors import ClusterStateError
    from cluster_state.store import ClusterStore

    # the smallest configuration a store is built on: restore adopts the snapshot's own
    store = ClusterStore(synthetic_config(nodes=8, vcs=1, pinned=0))
    try:
        store.restore(state)
    except ClusterStateError as exc:
        raise ConfigError(f"the backup's GPU store does not load: {exc}") from None
    return store


#: the entry point's object (pyproject.toml: ``cluster_state = "cluster_state.plugin:..."``)
CLUSTER_STATE: Final = ClusterStateKind()


class _StoreServices:
    """What the store serves beside a replica: gRPC (if it has an address) and the proposal
    of the file's configuration (while it is under way)."""

    def __init__(self, server: grpc.aio.Server | None, proposing: asyncio.Task[None]) -> None:
        self._server = server
        self._proposing = proposing

    async def stop(self) -> None:
        self._proposing.cancel()
        await asyncio.wait([self._proposing])  # its failure, if any, was logged
        if self._server is not None:
            await self._server.stop(GRPC_STOP_GRACE_S)


def _log_failure(task: asyncio.Task[None]) -> None:
    # A bug in the proposal must not stop the replica (it serves the configuration it runs),
    # but it must not vanish either.
    if not task.cancelled() and task.exception() is not None:
        _log.error("proposing the GPU configuration file failed",
                   exc_info=task.exception())


async def _propose_file_config(node: ReplicaNode, path: Path, me: int) -> None:
    """Propose the configuration in ``path`` through the log until the store runs it; an
    invalid file is logged and changes nothing."""
    from cluster_state.client import AllocationStore
    from cluster_state.errors import ClusterStateError
    from cluster_state.store import ClusterStore
    from consensus.errors import SDPaxosError

    store = node.state_machine
    if not isinstance(store, ClusterStore):  # not reachable with this kind's build
        return
    try:
        text, wanted = _read_gpu_config(path)
        needed = store.needs_reconfiguration(wanted)  # validates the whole configuration
    except (ClusterStateError, OSError) as exc:
        _log.error("replica %d: the GPU configuration file %s is not applied, still serving "
                   "configuration %s: %s", me, path, store.topology.digest.hex()[:12], exc)
        return
    if not needed:
        return
    client = AllocationStore.embedded(node)
    delay = RECONFIGURE_RETRY_S
    # Checked again before each attempt, after a linearizable read: the store has then
    # applied everything the log held when the read was ordered, so a restarted replica
    # still executing its own records, or one whose peer's proposal of the same file was
    # chosen meanwhile, does not propose it again (a repeat changes no GPU, but its session
    # entry changes the replicated state).
    while store.needs_reconfiguration(wanted):
        try:
            await client.summary()
            if not store.needs_reconfiguration(wanted):
                return
            _log.info("replica %d: proposing the changed GPU configuration file %s", me, path)
            result = await client.reconfigure(text)
        except ClusterStateError as exc:  # refused by the store: a retry is refused too
            _log.error("replica %d: the GPU configuration file %s was refused, still "
                       "serving configuration %s: %s", me, path,
                       store.topology.digest.hex()[:12], exc)
            return
        except SDPaxosError as exc:  # no outcome (no quorum yet, a failover): again
            _log.warning("replica %d: proposing the GPU configuration file: %s; again in "
                         "%.1f s", me, exc, delay)
            await asyncio.sleep(delay)
            delay = min(delay * 2, RECONFIGURE_RETRY_MAX_S)
            continue
        groups = result.report.get("groups", {})
        _log.info("replica %d: the log runs GPU configuration %s from %s (changed: %s; "
                  "groups: %s)", me, result.digest[:12], path, result.changed,
                  {name: info.get("outcome") for name, info in sorted(groups.items())})
        return


def _read_gpu_config(path: Path) -> tuple[str, GpuConfig]:
    """The text of a GPU configuration file and its configuration (``ClusterStateError``
    or ``OSError``)."""
    from cluster_state.config import parse_config

    text = path.read_text()
    return text, parse_config(text)


def gpu_config_path(config: ClusterConfig) -> Path:
    """The GPU cluster file of a cluster serving the store; ``ConfigError`` for another
    kind."""
    if config.state_machine != NAME:
        raise ConfigError(f'the cluster serves kind = "{config.state_machine}", not the GPU '
                          f'allocation store (kind = "{NAME}")')
    path: Path = config.state_machine_options[GPU_CONFIG_KEY]
    return path


def load_store(config: ClusterConfig) -> ClusterStore:
    """A fresh store on the cluster's GPU file as it is now (``ConfigError`` when it is
    missing or bad); a replica serves ``start_store``."""
    from cluster_state.config import load_config
    from cluster_state.errors import ClusterStateError
    from cluster_state.store import ClusterStore

    path = gpu_config_path(config)
    try:
        return ClusterStore(load_config(path))
    except (ClusterStateError, OSError) as exc:
        raise ConfigError(f"{path}: {exc}") from None


def start_config_path(config: ClusterConfig) -> Path:
    """Where the configuration the cluster's log began with is kept (``START_CONFIG_NAME``
    in its data directory)."""
    return config.data_dir / START_CONFIG_NAME


def start_store(config: ClusterConfig) -> ClusterStore:
    """A fresh store on the configuration the log began with (``start_config_path``; written
    from the GPU file, or a snapshot's configuration, at the first start). ``ConfigError``
    when the copy is bad or, at a first start, the GPU file is."""
    from cluster_state.config import parse_config
    from cluster_state.errors import ClusterStateError
    from cluster_state.store import ClusterStore

    copy = start_config_path(config)
    try:
        text = copy.read_text()
    except FileNotFoundError:
        text, built = _first_start(config, copy)
        if built is not None:
            return built
    except OSError as exc:
        raise ConfigError(f"{copy}: {exc}") from None
    try:
        return ClusterStore(parse_config(text))
    except ClusterStateError as exc:
        raise ConfigError(f"{copy} (the configuration the log began with): {exc}") from None


def _first_start(config: ClusterConfig, copy: Path) -> tuple[str, ClusterStore | None]:
    """Keep the configuration the log begins with at ``copy`` and return its text (that of
    the copy another replica sharing the data directory kept first, if one did) and, when
    that is the file's and no snapshot was found, the fresh store built on it (a 100k-GPU
    store takes a second to build: the first start builds it once)."""
    from cluster_state.config import parse_config
    from cluster_state.errors import ClusterStateError
    from cluster_state.store import ClusterStore

    path = gpu_config_path(config)
    try:
        text = path.read_text()
        store = ClusterStore(parse_config(text))
    except (ClusterStateError, OSError) as exc:
        raise ConfigError(f"{path}: {exc}") from None
    found, seeded = _seeded_config(config, store)
    if seeded is not None:
        _log.info("the data directory %s was seeded from a snapshot: its log begins with "
                  "the snapshot's GPU configuration", config.data_dir)
        text = seeded
    kept = _keep_once(copy, text)
    # a store that restored a snapshot holds its state: a fresh one is built for the log
    return kept, (store if kept == text and not found else None)


def _seeded_config(config: ClusterConfig, store: ClusterStore) -> tuple[bool, str | None]:
    """Whether the replicas' directories hold a snapshot (then ``store`` restored the oldest
    one, where the log they hold begins), and that snapshot's configuration when it is not
    ``store``'s: None without one (or when it does not load: the replica refuses it when it
    restores it, naming the file)."""
    from cluster_state.errors import ClusterStateError
    from consensus.errors import DecodeError
    from consensus.storage.snapshot import latest_snapshot

    oldest: tuple[int, bytes] | None = None
    for spec in config.replicas:
        try:
            found = latest_snapshot(config.replica_dir(spec.id) / SNAPSHOTS_DIR_NAME)
        except (DecodeError, OSError):
            continue
        if found is not None and (oldest is None or found[1].slot < oldest[0]):
            oldest = (found[1].slot, found[2])
    if oldest is None:
        return False, None
    digest = store.topology.digest
    try:
        store.restore(oldest[1])  # adopts the snapshot's configuration
    except ClusterStateError:
        return True, None
    if store.topology.digest == digest:
        return True, None  # the file's own text, as the operator wrote it
    return True, store.topology.config.to_yaml()


def _keep_once(copy: Path, text: str) -> str:
    """Durably create ``copy`` holding ``text`` unless it exists, and return what it holds.

    Temp file, fsync, then a hard link rather than a rename: the link fails if the file
    exists, so of replicas sharing the data directory that start together the first one's
    copy is the one they all read. Then the directory is fsynced (the new name is durable).
    """
    copy.parent.mkdir(parents=True, exist_ok=True)
    temp = copy.with_name(f"{copy.name}.{os.getpid()}.tmp")
    try:
        with open(temp, "w") as f:
            f.write(text)
            f.flush()
            os.fsync(f.fileno())
        with contextlib.suppress(FileExistsError):
            os.link(temp, copy)
        fd = os.open(copy.parent, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
        return copy.read_text()
    except OSError as exc:
        raise ConfigError(f"{copy}: {exc}") from None
    finally:
        with contextlib.suppress(OSError):
            temp.unlink()


def store_table(gpu_config: str) -> dict[str, str]:
    """The ``[state_machine]`` table serving the store on ``gpu_config`` (relative to the
    cluster file, or absolute)."""
    return {"kind": NAME, GPU_CONFIG_KEY: gpu_config}


def store_cluster_toml(
    replicas: int, base_port: int, *, wan: bool, gpu_config: str, cluster_id: str = "local"
) -> str:
    """``consensus.runtime.cli.cluster_toml`` for a cluster serving the store on
    ``gpu_config``, with gRPC on every replica (base_port + 300 + id)."""
    return cluster_toml(replicas, base_port, wan=wan, cluster_id=cluster_id,
                        state_machine=store_table(gpu_config), grpc=True)
