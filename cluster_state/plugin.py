"""The GPU allocation store as a kind of replicated state machine: ``[state_machine] kind =
"cluster_state"`` in a cluster file.

``consensus`` knows nothing about GPUs: it finds this kind by name through the
``sdpaxos.state_machines`` entry point group (pyproject.toml; see
``consensus.runtime.state_machines``). Everything the store adds to a replica lives here:

* the cluster file: ``gpu_config``, the HiveD-style cluster YAML file (relative to the cluster
  file); a replica's ``grpc_address`` is accepted because this kind serves gRPC;
* ``sdpaxos serve``: the ``ClusterStore`` built from that file, and the allocation service
  (``cluster_state.grpc_api.service``) on the replica's ``grpc_address``, stopped with it;
* ``sdpaxos cluster init --gpu-store | --gpu-config FILE``: a generated or given GPU cluster
  and a ``grpc_address`` for every replica.

The store, its configuration and gRPC are imported when used: ``sdpaxos cluster`` loads every
installed kind to offer its ``init`` options.
"""

from __future__ import annotations

import argparse
import logging
from collections.abc import Mapping
from pathlib import Path
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from consensus.errors import ConfigError
from consensus.runtime.cli import cluster_toml
from consensus.runtime.state_machines import InitChoice, Service, StateMachineKind

if TYPE_CHECKING:
    import grpc

    from cluster_state.store import ClusterStore
    from consensus.runtime.cluster_config import ClusterConfig
    from consensus.runtime.node import ReplicaNode

__all__ = [
    "CLUSTER_STATE",
    "NAME",
    "ClusterStateKind",
    "gpu_config_path",
    "load_store",
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
        return load_store(config)

    async def serve(self, node: ReplicaNode, config: ClusterConfig, me: int) -> Service | None:
        address = config.replica(me).grpc_address
        if address is None:
            return None
        from cluster_state.grpc_api.service import serve_grpc

        server = await serve_grpc(node, *address)
        _log.info("replica %d serving the allocation store over gRPC on %s:%d", me, *address)
        return _GrpcService(server)

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


class _GrpcService:
    def __init__(self, server: grpc.aio.Server) -> None:
        self._server = server

    async def stop(self) -> None:
        await self._server.stop(GRPC_STOP_GRACE_S)


def gpu_config_path(config: ClusterConfig) -> Path:
    """The GPU cluster file of a cluster serving the store; ``ConfigError`` for another
    kind."""
    if config.state_machine != NAME:
        raise ConfigError(f'the cluster serves kind = "{config.state_machine}", not the GPU '
                          f'allocation store (kind = "{NAME}")')
    path: Path = config.state_machine_options[GPU_CONFIG_KEY]
    return path


def load_store(config: ClusterConfig) -> ClusterStore:
    """A fresh store on the cluster's GPU file (``ConfigError`` when it is missing or bad)."""
    from cluster_state.config import load_config
    from cluster_state.errors import ClusterStateError
    from cluster_state.store import ClusterStore

    path = gpu_config_path(config)
    try:
        return ClusterStore(load_config(path))
    except (ClusterStateError, OSError) as exc:
        raise ConfigError(f"{path}: {exc}") from None


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
