"""The exception hierarchy of the ``consensus`` package.

::

    SDPaxosError
    ├── ConfigError            invalid configuration (local misuse, raised at construction)
    │   ├── DataDirInUse       another process serves this replica's data directory
    │   ├── ForeignDataDir     the data directory belongs to another cluster or replica
    │   └── MissingIdentity    an empty (wiped?) data directory of an existing cluster
    ├── MemberRefused          peers refuse this replica's identity (retired or wiped)
    ├── WALCorruption          durable log data is damaged: the replica stops rather than
    │                          lose what it acknowledged (``consensus.storage.wal``)
    ├── LocalProtocolError     the caller used a core wrongly (a bug in the driver)
    ├── InvariantViolation     a core's state broke a rule its owner states (a bug in the
    │                          core; checked in the simulator and tests,
    │                          ``consensus.protocol.checks``)
    ├── RemoteProtocolError    a peer or client sent something invalid (drop it, never crash)
    │   └── DecodeError        bytes that are not a valid frame or message
    │       └── UnsupportedVersion  a well-formed frame of a wire format this build cannot read
    └── RequestFailed          a client request did not complete
        ├── DefiniteFailure    it did not and never will take effect
        │   └── PermissionDenied  the request's principal may not do this; nothing changed
        │                         (``consensus.auth``)
        └── IndefiniteFailure  it may or may not take effect (e.g. timeout, failover)

``WALCorruption`` and ``PermissionDenied`` live beside what raises them. The GPU allocation
store has its own hierarchy (``cluster_state.errors``); no name means two things.
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DataDirInUse",
    "DecodeError",
    "DefiniteFailure",
    "ForeignDataDir",
    "IndefiniteFailure",
    "InvariantViolation",
    "LocalProtocolError",
    "MemberRefused",
    "MissingIdentity",
    "RemoteProtocolError",
    "RequestFailed",
    "SDPaxosError",
    "UnsupportedVersion",
]


class SDPaxosError(Exception):
    """Base class of every error this package raises."""


class ConfigError(SDPaxosError, ValueError):
    """A configuration value is invalid; the message names it."""


class DataDirInUse(ConfigError):
    """Another process holds the lock on a replica's data directory (``holder``: its pid, if
    it wrote one)."""

    def __init__(self, directory: object, holder: int | None) -> None:
        who = f"process {holder}" if holder is not None else "another process"
        super().__init__(
            f"data directory {directory} is in use by {who}: one replica process per data "
            "directory (stop it first, e.g. sdpaxos cluster down)"
        )
        self.directory = directory
        self.holder = holder

    def __reduce__(self) -> tuple[type[DataDirInUse], tuple[object, int | None]]:
        return (type(self), (self.directory, self.holder))


class ForeignDataDir(ConfigError):
    """The data directory's identity names another cluster or replica than the one starting."""

    def __init__(self, directory: object, owner: str, starting: str) -> None:
        super().__init__(
            f"data directory {directory} belongs to {owner}, not to {starting}: check the "
            "cluster file's data_dir and --id (a replica runs only on its own directory)"
        )
        self.directory = directory

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str]]:
        return (ConfigError, (str(self),))


class MissingIdentity(ConfigError):
    """An empty data directory, for a replica of a cluster that is not being bootstrapped:
    a replica that lost its disk must not rejoin as if it had not."""

    def __init__(self, directory: object, replica: int, cluster_id: str) -> None:
        super().__init__(
            f"data directory {directory} of replica {replica} of cluster {cluster_id!r} is "
            "empty (no IDENTITY): either this replica lost its disk — then it must not rejoin "
            "as if it had not, since it forgot what it promised and accepted: restore its "
            "directory, or seed a new cluster from a backup (sdpaxos snapshot save / "
            "restore); replacing one member while serving (sdpaxos member replace) is not "
            "built yet — or this is the first start of a new cluster: start it with "
            "--initial-cluster-state new (sdpaxos cluster init writes the identities itself)"
        )
        self.directory = directory

    def __reduce__(self) -> tuple[type[ConfigError], tuple[str]]:
        return (ConfigError, (str(self),))


class MemberRefused(SDPaxosError):
    """A peer refused this replica's identity (a retired incarnation, or a wiped or re-created
    data directory); the replica stops rather than run without a vote."""

    def __init__(self, peer: int, reason: str) -> None:
        super().__init__(f"replica {peer} refuses this replica: {reason}")
        self.peer = peer
        self.reason = reason

    def __reduce__(self) -> tuple[type[MemberRefused], tuple[int, str]]:
        return (type(self), (self.peer, self.reason))


class LocalProtocolError(SDPaxosError):
    """The local caller broke the core's contract (e.g. advanced a Ready twice)."""


class InvariantViolation(SDPaxosError, AssertionError):
    """A core's state broke an invariant its owner states (a bug in the core). Checked only
    where checks are on (the simulator, the tests: ``consensus.protocol.checks``)."""


class RemoteProtocolError(SDPaxosError):
    """A remote party sent something invalid. The receiver drops it and carries on."""


class DecodeError(RemoteProtocolError):
    """Bytes could not be decoded into a valid frame, message or record."""


class UnsupportedVersion(DecodeError):
    """The bytes carry a ``FORMAT_VERSION`` this build does not speak (``version`` says which)."""

    def __init__(self, version: int, supported: int) -> None:
        super().__init__(f"unsupported format version {version} (this build speaks {supported})")
        self.version = version
        self.supported = supported

    def __reduce__(self) -> tuple[type[UnsupportedVersion], tuple[int, int]]:
        return (type(self), (self.version, self.supported))


class RequestFailed(SDPaxosError):
    """A client request did not complete."""


class DefiniteFailure(RequestFailed):
    """The request did not take effect and never will."""


class IndefiniteFailure(RequestFailed):
    """The request may or may not have taken effect; retrying with the same (client id,
    sequence number) is safe."""
