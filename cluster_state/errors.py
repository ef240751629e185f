"""The exception hierarchy of the ``cluster_state`` package.

::

    ClusterStateError
    ├── GpuConfigError      the GPU configuration (HiveD's cell types, physical cells and
    │                       virtual clusters) is invalid; the message names the item
    ├── RequestError        an operation is invalid; the store answers ``["error", reason]``
    │                       and changes nothing
    ├── SnapshotError       snapshot bytes that this store cannot restore
    ├── EventsCompacted     a watcher asked for events older than the store still keeps
    ├── OlderReplica        a watch from now reached a replica of a build before it
    └── InvalidRequest      a client's request was refused by the store (the client side of
        │                   ``RequestError``: nothing changed)
        └── NotFound        ... because it names a group or VC the store does not hold
                            (gRPC NOT_FOUND)

A replicated state machine must never raise out of ``apply``: ``RequestError`` is raised
inside the allocator and turned into an error result by the store, and nothing else is
expected to escape (anything that does is a bug, not a user error).

``GpuConfigError`` is not ``consensus.errors.ConfigError`` (a cluster file, protocol or
replica setting that is invalid): a tool that loads both says which file is wrong.
"""

from __future__ import annotations

__all__ = [
    "ClusterStateError",
    "EventsCompacted",
    "GpuConfigError",
    "InvalidRequest",
    "NotFound",
    "OlderReplica",
    "RequestError",
    "SnapshotError",
]


class ClusterStateError(Exception):
    """Base class of every error this package raises."""


class GpuConfigError(ClusterStateError, ValueError):
    """The GPU configuration (``cluster_state.config``) is invalid; the message names the
    offending item."""


class RequestError(ClusterStateError, ValueError):
    """An operation is malformed or names something that does not exist.

    ``static`` is true when the verdict depends only on the op bytes and the configuration
    (not on the allocation state), so re-executing a retry yields the same error; the store
    then does not spend a session slot on it.
    """

    def __init__(self, reason: str, *, static: bool = True) -> None:
        super().__init__(reason)
        self.reason = reason
        self.static = static


class SnapshotError(ClusterStateError, ValueError):
    """Snapshot bytes are malformed or were taken with a different configuration."""


class EventsCompacted(ClusterStateError):
    """The events after ``revision`` are partly gone; the watcher must re-read the state.

    ``oldest`` is the smallest revision a watcher may still resume from.
    """

    def __init__(self, revision: int, oldest: int) -> None:
        super().__init__(
            f"events after revision {revision} were compacted (resume from >= {oldest})"
        )
        self.revision = revision
        self.oldest = oldest

    def __reduce__(self) -> tuple[type[EventsCompacted], tuple[int, int]]:
        return (type(self), (self.revision, self.oldest))


class OlderReplica(ClusterStateError):
    """A watch from now reached a replica of a build that does not know
    ``WatchRequest.from_now`` (it answered the events after the request's ``since``)."""


class InvalidRequest(ClusterStateError):
    """The store refused a request (unknown VC, priority out of range, ...): nothing changed."""

    def __init__(self, reason: str) -> None:
        super().__init__(reason)
        self.reason = reason


class NotFound(InvalidRequest):
    """The request names a group or virtual cluster the store does not hold: nothing
    changed (over gRPC, ``NOT_FOUND``)."""
