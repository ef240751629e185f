"""A new local cluster directory, written all at once (``sdpaxos cluster init``, ``sdpaxos
snapshot restore``).

The caller checks its inputs first (ports, the state machine's options and files); then
``write_new_cluster`` writes the cluster file, the state machine's files, every replica's
identity, the TLS certificates and (restore) the seeded snapshots into a staging directory
beside the target, loads the result back as a replica would, and renames the staging
directory into place last. A command that fails at any step leaves nothing behind (the
staging directory is removed; an interrupted one is a hidden ``.NAME.new-*`` beside it), so a
retry is never refused for what a failed attempt wrote.

A directory that exists is written into only where nothing is in the way. ``--force`` over an
existing cluster (its replicas' data stays) replaces its cluster file, the state machine's
files and the certificates: the staged file is checked against the data first (every replica
directory that has an identity must be the new file's replica of the same cluster), then the
staged entries are moved in one by one, and replicas new to the file get identities.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Final

from consensus.errors import ConfigError, MemberRemoved
from consensus.runtime.cluster_config import ClusterConfig, load_cluster_config
from consensus.runtime.state_machines import InitFile
from consensus.storage.identity import open_identity, read_identity

__all__ = ["CONFIG_NAME", "init_identities", "write_new_cluster"]

#: the cluster file's name in a local cluster's directory
CONFIG_NAME: Final = "cluster.toml"


def init_identities(path: Path) -> ClusterConfig:
    """Give every replica of the cluster file ``path`` its identity in its data directory
    (one that has one keeps it; ``ConfigError`` if it belongs to another cluster or
    replica); the file's configuration."""
    config = load_cluster_config(path)
    for spec in config.replicas:
        with contextlib.suppress(MemberRemoved):  # removed: it keeps its (removed) identity
            open_identity(config.replica_dir(spec.id), config.cluster_id, spec.id,
                          bootstrap=True)
    return config


def write_new_cluster(
    directory: Path, text: str, files: Mapping[str, InitFile], *, force: bool = False,
    certificates: Callable[[Path], str] | None = None,
    seed: Callable[[ClusterConfig], None] | None = None,
) -> list[str]:
    """Write the cluster file ``text``, ``files`` beside it, the replicas' identities, the
    certificates (``certificates(cluster file)``, returning what it made) and the ``seed``
    (given the new cluster's configuration) into ``directory``, all or nothing (see the
    module). Returns what was written, a line each. ``ConfigError`` (or ``OSError``) when
    anything fails; nothing is left behind then."""
    parent = directory.absolute().parent
    made = _make_parents(parent)
    staging = Path(tempfile.mkdtemp(prefix=f".{directory.name}.new-", dir=parent))
    try:
        staged = staging / CONFIG_NAME
        staged.write_text(text)
        for name, file in files.items():
            (staging / name).write_text(file.text)
        written = [f"wrote {directory / CONFIG_NAME}"]
        written += [f"wrote {directory / name}" + (f" ({file.about})" if file.about else "")
                    for name, file in files.items()]
        if certificates is not None:
            written.append(certificates(staged).replace(str(staging), str(directory)))
        replace = force and (directory / CONFIG_NAME).exists()
        if replace:
            _check_data(directory, staging, load_cluster_config(staged))
        else:
            config = init_identities(staged)  # loaded back as a replica would load it
            if seed is not None:
                seed(config)
        _publish(staging, directory, replace=replace)
        if replace:  # the data there keeps its identities; new replicas get theirs
            init_identities(directory / CONFIG_NAME)
        return written
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        for path in reversed(made):  # innermost first
            with contextlib.suppress(OSError):
                path.rmdir()
        raise
    finally:
        shutil.rmtree(staging, ignore_errors=True)


def _make_parents(parent: Path) -> list[Path]:
    """Create ``parent`` and its missing ancestors; the ones created, outermost first."""
    missing = []
    while not parent.exists():
        missing.append(parent)
        parent = parent.parent
    for path in reversed(missing):
        path.mkdir()
    return list(reversed(missing))


def _has_entries(directory: Path) -> bool:
    return directory.is_dir() and any(directory.iterdir())


def _check_data(directory: Path, staging: Path, config: ClusterConfig) -> None:
    """Every replica directory of the new file (staged in ``staging``) under ``directory``
    that has an identity belongs to that replica of the same cluster (``ConfigError`` naming
    the first that does not)."""
    for spec in config.replicas:
        replica_dir = config.replica_dir(spec.id)
        with contextlib.suppress(ValueError):  # a data_dir inside the cluster's directory
            replica_dir = directory / replica_dir.relative_to(staging)
        found = read_identity(replica_dir)
        if found is not None and (found.cluster_id, found.replica_id) != (
            config.cluster_id, spec.id
        ):
            raise ConfigError(f"{replica_dir} holds the data of {found.describe()}, the new "
                              f"cluster file names replica {spec.id} of cluster "
                              f"{config.cluster_id!r} there: delete that data or choose "
                              "another --dir")


def _publish(staging: Path, directory: Path, *, replace: bool) -> None:
    """Move the staged cluster into ``directory``: one rename when it is new or empty, else
    each staged entry beside what is there, over it only when ``replace`` (``--force`` over
    a cluster: nothing of its data is staged)."""
    if not _has_entries(directory):
        with contextlib.suppress(FileNotFoundError):
            directory.rmdir()  # an empty directory is replaced by the staged one
        os.rename(staging, directory)
        return
    entries = sorted(staging.iterdir())
    clash = [entry.name for entry in entries if (directory / entry.name).exists()]
    if clash and not replace:
        raise ConfigError(f"{directory} already holds {', '.join(clash)}: choose another "
                          "--dir")
    added: list[Path] = []
    try:
        for entry in entries:
            target = directory / entry.name
            if not target.exists():
                os.rename(entry, target)
                added.append(target)
            elif entry.is_dir():  # --force: a directory (tls/) replaced whole
                old = target.with_name(f".{target.name}.old")
                shutil.rmtree(old, ignore_errors=True)
                os.rename(target, old)
                os.rename(entry, target)
                shutil.rmtree(old, ignore_errors=True)
            else:
                os.replace(entry, target)
    except BaseException:
        for path in added:
            shutil.rmtree(path, ignore_errors=True) if path.is_dir() else path.unlink()
        raise
