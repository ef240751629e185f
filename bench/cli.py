"""``sdpaxos``: the command line. Each subcommand lives with the code it drives; this module
only assembles them, importing the module of the subcommand being run and no other."""

from __future__ import annotations

import argparse
import importlib
import sys
from collections.abc import Sequence

#: subcommand -> (where its ``add_arguments(parser)`` and ``run(args) -> int`` live, help).
#: ``module:name`` means ``add_<name>_arguments`` and ``run_<name>`` in that module.
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "sim": ("consensus.sim.cli", "run the deterministic simulator over many seeds"),
    "lincheck": ("consensus.sim.lincheck", "check a recorded JSON-lines history"),
    "serve": ("consensus.runtime.cli:serve", "run one replica from a cluster file"),
    "cluster": ("consensus.runtime.cli:cluster", "init / up / down a local cluster"),
    "cert": ("consensus.runtime.cli:cert", "a TLS cluster's certificates: init / issue / revoke"),
    "member": ("consensus.runtime.member_cli:member",
               "the live members: list / add / promote / remove / replace"),
    "snapshot": ("consensus.runtime.backup:snapshot",
                 "back up a live cluster (save) / seed a new one from a backup (restore)"),
    "bench": ("bench.commands", "benchmarks (see sdpaxos bench --help)"),
    "demo": ("cluster_state.demo", "a local geo-replicated GPU allocation store, live"),
    "scheduler": ("cluster_state.demo:scheduler", "run one site's demo schedulers"),
    "endpoint": ("consensus.runtime.endpoint:endpoint",
                 "each replica's status / health (--cluster: every member)"),
    "get": ("consensus.runtime.kv_cli:get", "key-value store: read a key"),
    "put": ("consensus.runtime.kv_cli:put", "key-value store: write a key"),
    "del": ("consensus.runtime.kv_cli:del", "key-value store: delete a key"),
    "cas": ("consensus.runtime.kv_cli:cas", "key-value store: compare-and-set a key"),
    "watch": ("consensus.runtime.kv_cli:watch", "key-value store: print a key's changes"),
    "ctl": ("cluster_state.ctl", "the GPU allocation store over gRPC: submit, release, ..."),
    "extender": ("cluster_state.k8s.cli", "a HiveD-compatible Kubernetes scheduler extender"),
    "nemesis": ("bench.nemesis", "kill/stop/restart/partition a local cluster under load"),
}


def build_parser(only: str | None = None) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="sdpaxos", description="SDPaxos replication library and GPU allocation store"
    )
    parser.add_argument("--version", action="version", version=f"%(prog)s {_version()}",
                        help="print the version and exit")
    commands = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (location, help_text) in SUBCOMMANDS.items():
        sub = commands.add_parser(name, help=help_text, description=help_text)
        if name != only:
            continue
        module_path, _, suffix = location.partition(":")
        module = importlib.import_module(module_path)
        add = getattr(module, f"add_{suffix}_arguments" if suffix else "add_arguments")
        run = getattr(module, f"run_{suffix}" if suffix else "run")
        add(sub)
        sub.set_defaults(_run=run)
    return parser


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("sdpaxos")
    except PackageNotFoundError:  # a source tree that was never installed
        return "unknown"


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    chosen = next((arg for arg in argv if not arg.startswith("-")), None)
    args = build_parser(chosen if chosen in SUBCOMMANDS else None).parse_args(argv)
    code: int = args._run(args)
    return code


if __name__ == "__main__":
    sys.exit(main())
