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
    ├── MemberRemoved          a membership change removed this replica (it never serves again)
    ├── LocalProtocolError     the caller used a core wrongly (a bug in the driver)
    ├── InvariantViolation     a core's state broke a rule its owner states (a bug in the
    │                          core; checked in the simulator and tests,
    │                          ``consensus.protocol.checks``)
    ├── RemoteProtocolError    a peer or client sent something invalid (drop it, never crash)
    │   └── DecodeError        bytes that are not a valid frame or message
    │       └── UnsupportedVersion  a well-formed frame of a wire format this build cannot read
    └── RequestFailed          a client request did not complete
        ├── DefiniteFailure    it did not and never will take effect
        │   ├── PermissionDenied  the request's principal may not do this; nothing changed
        │   │                     (``consensus.auth``)
        │   ├── SessionExpired its session was evicted or closed: not applied (open another)
        │   ├── TlsRefused     a TLS handshake failed for a reason a retry does not change
        │   └── Unreachable    no replica could be reached: the request never left
        │                      (retry later; exit code 3, like an indefinite failure)
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
    "MemberRemoved",
    "MissingIdentity",
    "RemoteProtocolError",
    "RequestFailed",
    "SDPaxosError",
    "SessionExpired",
    "TlsRefused",
    "Unreachable",
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
            "empty (no IDENTITY): this replica lost its data, and a replica that forgot what "
            "it promised and accepted must not vote again. Replace it with a new member that "
            f"learns the log: sdpaxos member replace --config CLUSTER_FILE {replica} "
            "--address HOST:PORT --client-address HOST:PORT --site SITE (then start the new "
            "member with the command it prints). A new cluster's directories get their "
            "identities from sdpaxos cluster init"
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


class MemberRemoved(SDPaxosError):
    """A membership change removed this replica from its cluster: it stops, and its data
    directory never serves again (ids are never reused; a replica there again is a new member
    with a new id and an empty directory: ``sdpaxos member add``)."""

    def __init__(self, replica: int, cluster_id: str, epoch: int) -> None:
        super().__init__(
            f"replica {replica} of cluster {cluster_id!r} was removed from the cluster (its "
            f"configuration of epoch {epoch} no longer names it): it does not serve again; "
            "its data directory may be deleted. To run a replica here again, add a new member "
            "(sdpaxos member add prints its cluster-file entry) with an empty data directory"
        )
        self.replica = replica
        self.cluster_id = cluster_id
        self.epoch = epoch

    def __reduce__(self) -> tuple[type[MemberRemoved], tuple[int, str, int]]:
        return (type(self), (self.replica, self.cluster_id, self.epoch))


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


class TlsRefused(DefiniteFailure):
    """A connection to a replica failed at TLS for a reason retrying does not change: the
    replica requires TLS and this client spoke plaintext (or the other way round), its
    certificate is not of the CA this client trusts, or it does not take this client's
    certificate, or refuses it outright (revoked, not a client's). The message says which
    (``consensus.runtime.tls_diagnosis``); the command line exits 5 (``TLS_REFUSED``) for
    it: no retry changes it."""


class Unreachable(DefiniteFailure):
    """No replica could be reached (every connection was refused or could not be made): the
    request never left the client, so it did not and cannot take effect. Retrying later is
    the remedy, as for an indefinite failure (the command line exits 3 for both)."""


class IndefiniteFailure(RequestFailed):
    """The request may or may not have taken effect; retrying with the same (client id,
    sequence number) is safe."""


class SessionExpired(DefiniteFailure):
    """The replicated session table no longer holds the request's session (evicted, closed,
    or its open-by time passed: ``consensus.sessions``), so the request was not applied and
    never will be. ``log_time``: the cluster's log time then (Unix seconds; 0 if unknown), from
    which a client opens its next session. A client that had sent the same request before
    without an answer learns only that it will not run from now on (the native client
    reports an ``IndefiniteFailure`` then)."""

    def __init__(self, message: str, log_time: int = 0) -> None:
        super().__init__(message)
        self.log_time = log_time

    def __reduce__(self) -> tuple[type[SessionExpired], tuple[str, int]]:
        return (type(self), (str(self), self.log_time))
