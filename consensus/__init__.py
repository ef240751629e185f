"""SDPaxos: semi-decentralized Paxos (SoCC'18) as a sans-I/O library.

Public entry points: ``consensus.protocol.sdpaxos.SDPaxosReplica`` (the core),
``consensus.config.ProtocolConfig``, ``consensus.messages``, ``consensus.codec``,
``consensus.statemachine`` and the simulator in ``consensus.sim``.
"""

from consensus.config import ProtocolConfig
from consensus.errors import (
    ConfigError,
    DecodeError,
    DefiniteFailure,
    IndefiniteFailure,
    LocalProtocolError,
    RemoteProtocolError,
    RequestFailed,
    SDPaxosError,
    UnsupportedVersion,
)
from consensus.messages import Command

__all__ = [
    "Command",
    "ConfigError",
    "DecodeError",
    "DefiniteFailure",
    "IndefiniteFailure",
    "LocalProtocolError",
    "ProtocolConfig",
    "RemoteProtocolError",
    "RequestFailed",
    "SDPaxosError",
    "UnsupportedVersion",
]
