"""The exception hierarchy of the ``consensus`` package.

::

    SDPaxosError
    ├── ConfigError            invalid configuration (local misuse, raised at construction)
    │   └── DataDirInUse       another process serves this replica's data directory
    ├── LocalProtocolError     the caller used a core wrongly (a bug in the driver)
    ├── RemoteProtocolError    a peer or client sent something invalid (drop it, never crash)
    │   └── DecodeError        bytes that are not a valid frame or message
    │       └── UnsupportedVersion  a well-formed frame of a wire format this build cannot read
    └── RequestFailed          a client request did not complete
        ├── DefiniteFailure    it did not and never will take effect
        └── IndefiniteFailure  it may or may not take effect (e.g. timeout, failover)
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DataDirInUse",
    "DecodeError",
    "DefiniteFailure",
    "IndefiniteFailure",
    "LocalProtocolError",
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


class LocalProtocolError(SDPaxosError):
    """The local caller broke the core's contract (e.g. advanced a Ready twice)."""


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
