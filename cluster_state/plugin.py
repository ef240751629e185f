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
  and a ``grpc_address`` for every replica.

**The configuration the log began with is in the log** (``cluster_state.store``). A replica of
a cluster created by this build builds its store from its ``gpu_config`` file, unconfigured:
the log's first proposal of a replica's file (below) sets the configuration, on every replica
alike, and updates before it are refused (an operator's ``ctl config apply`` included: its
client sends it again once the log has a configuration). So a replica that executes the log
from slot 0 — a new member, a wiped disk, one whose file was edited meanwhile — runs it under
the configuration the log began with, whatever its file says. A cluster seeded from a snapshot
(a backup) begins with the snapshot's configuration, which it carries. A data directory of an
earlier build keeps the configuration its log began with beside the replicas
(``START_CONFIG_NAME``): its store is built from that copy, configured, as before (the log of
such a cluster holds no first configuration).

**Who proposes a changed file: the log is the truth.** Once the node serves, a replica reads
through the log (a linearizable read: its store then holds what the log held) and proposes its
file's configuration (``ops.reconfigure(text, from_file=True)``) only if the log set none yet
(a new cluster: its first configuration) or never ran this one (``ClusterStore.file_is_new``);
the store applies a file's proposal only on the same condition, so concurrent proposals of
one edit take effect once. An edited file is thus proposed by the first replica to restart
with it and not again; a replica restarted with an older file does not bring it back; and
``sdpaxos ctl config apply FILE`` stays in force across restarts (no file it ran before
undoes it; to go back to one, apply it again). A file that does not load or validate is
logged as an error and the replica keeps serving the configuration its log runs: it never
stops over it (a replica with no snapshot and no valid file cannot start).

The store, its configuration and gRPC are imported when used: ``sdpaxos cluster`` loads every
installed kind to offer its ``init`` options.

``/metrics``: the store's per-VC GPU and group gauges and its preemption counters
(``cluster_state.metrics``).
"""

from __future__ import annotations

import argparse
import asyncio
import logging
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

import msgpack

from consensus.errors import ConfigError
from consensus.runtime.cli import cluster_toml
from consensus.runtime.state_machines import (
    InitChoice,
    MetricsSource,
    Service,
    StateMachineKind,
)

if TYPE_CHECKING:
    import grpc

    from cluster_state.config import ClusterConfig as GpuConfig
    from cluster_state.store import ClusterStore
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

#: the copy of the GPU configuration the log began with, in the ``data_dir`` of a cluster of
#: an earlier build (read; this build keeps the first configuration in the log)
START_CONFIG_NAME: Final = "gpu-config.start.yaml"

#: a replica's snapshots, in its own directory (as ``consensus.runtime.node`` keeps them):
#: read when the GPU file does not load, for a configuration to start from
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
                store = AuthorizedStore(store.topology, configured=store.configured)
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
        if given is not None:
            try:  # refuse a bad file now rather than when the replicas start
                load_config(given)
            except (ClusterStateError, OSError) as exc:
                raise ConfigError(f"{given}: {exc}") from None
            gpu = str(Path(given).resolve())
        elif getattr(args, "gpu_store", False):
            gpu = GENERATED_FILE
            generated = cluster_file.parent / gpu
            generated.write_text(synthetic_config(
                nodes=GENERATED_NODES, vcs=GENERATED_VCS, pinned=GENERATED_PINNED
            ).to_yaml())
            print(f"wrote {generated} ({GENERATED_NODES} nodes x 8 GPUs, {GENERATED_VCS} "
                  "virtual clusters)")
        else:
            return None
        return InitChoice(
            table={GPU_CONFIG_KEY: gpu},
            grpc=True,
            hint=f"the GPU allocation store: sdpaxos ctl --config {cluster_file} status",
        )


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
    """Propose the configuration in ``path`` through the log if the log set none yet or
    never ran it (the module's rule), until it applied; an invalid file is logged and changes
    nothing."""
    from cluster_state.client import AllocationStore
    from cluster_state.errors import ClusterStateError
    from cluster_state.store import ClusterStore
    from consensus.errors import SDPaxosError

    store = node.state_machine
    if not isinstance(store, ClusterStore):  # not reachable with this kind's build
        return
    try:
        text, wanted = _read_gpu_config(path)
        store.file_is_new(wanted)  # validates the whole configuration
    except (ClusterStateError, OSError) as exc:
        _log.error("replica %d: the GPU configuration file %s is not applied, still serving "
                   "configuration %s: %s", me, path, store.topology.digest.hex()[:12], exc)
        return
    client = AllocationStore.embedded(node)
    delay = RECONFIGURE_RETRY_S
    # Decided after a linearizable read: the store has then applied everything the log held
    # when the read was ordered, so a restarted replica still executing its own records, or
    # one whose peer's proposal of the same file was chosen meanwhile, does not propose it
    # again (the store would change nothing, but the repeat's session entry would change the
    # replicated state).
    while True:
        try:
            await client.summary()
            if not store.file_is_new(wanted):
                return
            _log.info("replica %d: proposing the GPU configuration file %s (%s)", me, path,
                      "changed" if store.configured else "the log's first configuration")
            result = await client.reconfigure(text, from_file=True)
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
    """Where a data directory of an earlier build kept the configuration its log began with
    (``START_CONFIG_NAME`` in its data directory; this build writes none)."""
    return config.data_dir / START_CONFIG_NAME


def start_store(config: ClusterConfig) -> ClusterStore:
    """The store a replica serves: built on the kept copy of an earlier build's data
    directory (configured: its log holds no first configuration), else on the GPU file,
    unconfigured (the log's first file proposal sets it), or, when the file does not load,
    on the configuration of a snapshot the replicas hold (restored anyway). ``ConfigError``
    when the copy is bad, or the file is and no snapshot is there."""
    from cluster_state.config import parse_config
    from cluster_state.errors import ClusterStateError
    from cluster_state.store import ClusterStore

    copy = start_config_path(config)
    try:
        text = copy.read_text()
    except FileNotFoundError:
        pass
    except OSError as exc:
        raise ConfigError(f"{copy}: {exc}") from None
    else:
        try:
            return ClusterStore(parse_config(text))
        except ClusterStateError as exc:
            raise ConfigError(f"{copy} (the configuration the log began with): {exc}") from None
    path = gpu_config_path(config)
    try:
        return ClusterStore(parse_config(path.read_text()), configured=False)
    except (ClusterStateError, OSError) as exc:
        seeded = _snapshot_store(config)
        if seeded is None:
            raise ConfigError(f"{path}: {exc}") from None
        _log.error("the GPU configuration file %s does not load (%s): starting from the "
                   "replicas' snapshot", path, exc)
        return seeded


def _snapshot_store(config: ClusterConfig) -> ClusterStore | None:
    """An unconfigured store on the configuration of the latest snapshot the replicas' own
    directories hold (None without one that loads): what a replica whose file does not load
    starts from before it restores its snapshot."""
    from cluster_state.cells import Topology
    from cluster_state.config import parse_config
    from cluster_state.errors import ClusterStateError
    from cluster_state.store import ClusterStore
    from consensus.errors import DecodeError
    from consensus.storage.snapshot import latest_snapshot

    latest: tuple[int, bytes] | None = None
    for spec in config.replicas:
        try:
            found = latest_snapshot(config.replica_dir(spec.id) / SNAPSHOTS_DIR_NAME)
        except (DecodeError, OSError):
            continue
        if found is not None and (latest is None or found[1].slot > latest[0]):
            latest = (found[1].slot, found[2])
    if latest is None:
        return None
    try:
        fields = msgpack.unpackb(latest[1])
        return ClusterStore(Topology(parse_config(msgpack.unpackb(fields[2]))),
                            configured=False)
    except (ClusterStateError, ValueError, TypeError, IndexError):
        return None


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
