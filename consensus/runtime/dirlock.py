"""An exclusive lock on a replica's data directory: one process serves it at a time.

Two replica processes on one write-ahead log interleave appends and rewrite each other's
snapshots: ``sdpaxos cluster up`` run twice once started a second set of replicas over the
first one's logs. ``DataDirLock`` takes ``flock`` on ``LOCK`` in the directory (released by the
kernel when the process dies, even by ``kill -9``, so a stale lock never blocks a restart) and
writes its pid there, so that a refusal names the holder, and ``lock_holder`` tells the tools
(``sdpaxos cluster up|down|restart``) which process serves a directory, however it was started.
"""

from __future__ import annotations

import contextlib
import fcntl
import os
from pathlib import Path

from consensus.errors import DataDirInUse

__all__ = ["LOCK_NAME", "UNKNOWN_HOLDER", "DataDirLock", "lock_holder"]

#: the lock file's name in the data directory
LOCK_NAME = "LOCK"
#: ``lock_holder`` of a directory locked by a process that has not written its pid yet
UNKNOWN_HOLDER = 0


class DataDirLock:
    """Hold the lock on ``directory`` (created if missing) until ``release``; raises
    ``DataDirInUse`` naming the holder's pid if another open of it holds the lock."""

    def __init__(self, directory: Path) -> None:
        directory.mkdir(parents=True, exist_ok=True)
        self.path = directory / LOCK_NAME
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT, 0o600)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = os.read(fd, 32).decode(errors="replace").strip()
            os.close(fd)
            raise DataDirInUse(directory, int(holder) if holder.isdigit() else None) from None
        os.ftruncate(fd, 0)
        os.write(fd, f"{os.getpid()}\n".encode())
        self._fd: int | None = fd

    def release(self) -> None:
        if self._fd is not None:
            with contextlib.suppress(OSError):
                os.ftruncate(self._fd, 0)
            os.close(self._fd)  # closing releases the flock
            self._fd = None

    def __enter__(self) -> DataDirLock:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


def lock_holder(directory: Path) -> int | None:
    """The pid of the process holding ``directory``'s lock (``UNKNOWN_HOLDER`` while it has
    not written its pid yet), or None when no process holds it. Asks with a shared lock taken
    and dropped at once, so a replica starting at that very instant may be refused once."""
    try:
        fd = os.open(directory / LOCK_NAME, os.O_RDONLY)
    except FileNotFoundError:
        return None
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        except BlockingIOError:
            text = os.read(fd, 32).decode(errors="replace").strip()
            return int(text) if text.isdigit() else UNKNOWN_HOLDER
        fcntl.flock(fd, fcntl.LOCK_UN)
        return None
    finally:
        os.close(fd)
