"""A batch of client commands being gathered for one instance (or one forward).

Bounded by count (``max_batch``) and by size (``max_batch_bytes`` of ``Command.size``): with
the codec's per-command limits that keeps every message carrying a batch below a frame, however
large the commands of one turn. A command larger than the size bound goes alone.
"""

from __future__ import annotations

from collections.abc import Iterable

from consensus.config import ProtocolConfig
from consensus.messages import Command

__all__ = ["CATCHUP_BYTES", "CommandBatch", "batch_size"]

#: A catch-up answer stops adding values past this many command bytes (``batch_size``); the
#: asker asks again from where it got to.
CATCHUP_BYTES = 4 << 20


def batch_size(commands: Iterable[Command]) -> int:
    """What ``commands`` weigh against a byte bound (``Command.size`` summed)."""
    return sum(command.size() for command in commands)


class CommandBatch:
    __slots__ = ("_commands", "_max_bytes", "_max_count", "_size")

    def __init__(self, config: ProtocolConfig) -> None:
        self._commands: list[Command] = []
        self._size = 0
        self._max_count = config.max_batch
        self._max_bytes = config.max_batch_bytes

    def __len__(self) -> int:
        return len(self._commands)

    def add(self, command: Command) -> bool:
        """Add ``command``; True if the batch is full now (take it before adding more)."""
        self._commands.append(command)
        self._size += command.size()
        return len(self._commands) >= self._max_count or self._size >= self._max_bytes

    def take(self) -> tuple[Command, ...]:
        """The commands gathered so far, in order; the batch is empty afterwards."""
        commands = tuple(self._commands)
        self._commands.clear()
        self._size = 0
        return commands
