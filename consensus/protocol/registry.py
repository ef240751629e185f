"""The protocol cores by name: what ``sdpaxos sim --protocol`` and the cluster file's
``[protocol] name`` choose from. Modules are imported when first used."""

from __future__ import annotations

import importlib
from collections.abc import Callable, Mapping
from types import MappingProxyType
from typing import TYPE_CHECKING, Any, Final

from consensus.errors import ConfigError

if TYPE_CHECKING:
    from consensus.protocol.base import DrivenCore
    from consensus.protocol.epaxos import EPaxosReplica
    from consensus.protocol.membership import MemberReplica
    from consensus.protocol.mencius import MenciusReplica
    from consensus.protocol.multipaxos import MultiPaxosReplica
    from consensus.protocol.sdpaxos import SDPaxosReplica

    def _every_core_is_driven(
        a: SDPaxosReplica, b: MultiPaxosReplica, c: MenciusReplica, d: EPaxosReplica,
        e: MemberReplica,
    ) -> list[DrivenCore]:
        return [a, b, c, d, e]  # mypy checks each core against the driver's interface


__all__ = ["PROTOCOLS", "load_core"]

#: protocol name -> "module:factory"; every factory takes ``(config, me, *, recovered, rng,
#: snapshot)`` and returns a core (``consensus.protocol.base.DrivenCore``)
PROTOCOLS: Final[Mapping[str, str]] = MappingProxyType(
    {
        # SDPaxos whose members may change: one SDPaxosReplica per epoch
        "sdpaxos": "consensus.protocol.membership:MemberReplica",
        "multipaxos": "consensus.protocol.multipaxos:MultiPaxosReplica",
        "mencius": "consensus.protocol.mencius:MenciusReplica",
        "epaxos": "consensus.protocol.epaxos:EPaxosReplica",
    }
)


def load_core(name: str) -> Callable[..., Any]:
    """The core factory (class) registered as ``name``; ``ConfigError`` for an unknown one."""
    target = PROTOCOLS.get(name)
    if target is None:
        raise ConfigError(f"unknown protocol {name!r}; choose from {', '.join(sorted(PROTOCOLS))}")
    module_name, _, attribute = target.partition(":")
    factory: Callable[..., Any] = getattr(importlib.import_module(module_name), attribute)
    return factory
