"""The exception hierarchy of the ``consensus`` package.

::

    SDPaxosError
    ├── ConfigError            invalid configuration (local misuse, raised at construction)
    ├── LocalProtocolError     the caller used a core wrongly (a bug in the driver)
    ├── RemoteProtocolError    a peer or client sent something invalid (drop it, never crash)
    │   └── DecodeError        bytes that are not a valid frame or message
    └── RequestFailed          a client request did not complete
        ├── DefiniteFailure    it did not and never will take effect
        └── IndefiniteFailure  it may or may not take effect (e.g. timeout, failover)
"""

from __future__ import annotations

__all__ = [
    "ConfigError",
    "DecodeError",
    "DefiniteFailure",
    "IndefiniteFailure",
    "LocalProtocolError",
    "RemoteProtocolError",
    "RequestFailed",
    "SDPaxosError",
]


class SDPaxosError(Exception):
    """Base class of every error this package raises."""


class ConfigError(SDPaxosError, ValueError):
    """A configuration value is invalid; the message names it."""


class LocalProtocolError(SDPaxosError):
    """The local caller broke the core's contract (e.g. advanced a Ready twice)."""


class RemoteProtocolError(SDPaxosError):
    """A remote party sent something invalid. The receiver drops it and carries on."""


class DecodeError(RemoteProtocolError):
    """Bytes could not be decoded into a valid frame, message or record."""


class RequestFailed(SDPaxosError):
    """A client request did not complete."""


class DefiniteFailure(RequestFailed):
    """The request did not take effect and never will."""


class IndefiniteFailure(RequestFailed):
    """The request may or may not have taken effect; retrying with the same (client id,
    sequence number) is safe."""
