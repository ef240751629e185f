"""A batch of commands as it came off the wire: its msgpack bytes, decoded on first use.

An acceptor persists a batch and acknowledges it without looking at the commands inside, and
its log record splices the very bytes it received (``consensus.codec``); the commands are
decoded once, when something reads them (execution, the sequencer's key history), and kept.

A ``PackedBatch`` is a read-only sequence of ``Command`` equal to the tuple of its commands:
``==`` and ``hash`` agree with that tuple's, so protocol cores mix it freely with the tuples
they build. Two packed batches with the same bytes are equal without decoding either.

Its bytes are checked for msgpack structure, length bounds and the command count when the
frame is decoded; the commands' fields are checked when first read. A batch whose commands
fail those checks reads as empty (``malformed`` says why): every replica holds the same bytes
and reads them the same way, so a forged batch that got chosen is a no-op everywhere, and no
replica crashes on it.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from typing import TYPE_CHECKING, ClassVar, overload

from consensus.errors import DecodeError

if TYPE_CHECKING:
    from consensus.messages import Command

__all__ = ["PackedBatch"]


class PackedBatch(Sequence["Command"]):
    __slots__ = ("_commands", "malformed", "packed")

    #: bytes -> the commands they pack, checked (``DecodeError`` otherwise); the codec sets it
    decoder: ClassVar[Callable[[bytes], tuple[Command, ...]]]

    def __init__(self, packed: bytes) -> None:
        #: a msgpack array of commands, as received
        self.packed = packed
        #: why the commands did not decode (the batch then reads as empty), else None
        self.malformed: str | None = None
        self._commands: tuple[Command, ...] | None = None

    @property
    def commands(self) -> tuple[Command, ...]:
        """The commands, decoded the first time they are asked for."""
        commands = self._commands
        if commands is None:
            try:
                commands = PackedBatch.decoder(self.packed)
            except DecodeError as exc:
                self.malformed = str(exc)
                commands = ()
            self._commands = commands
        return commands

    @property
    def decoded(self) -> bool:
        """True once the commands were decoded (for tests and metrics)."""
        return self._commands is not None

    def __len__(self) -> int:
        return len(self.commands)

    def __bool__(self) -> bool:
        return bool(self.commands)

    def __iter__(self) -> Iterator[Command]:
        return iter(self.commands)

    @overload
    def __getitem__(self, index: int) -> Command: ...

    @overload
    def __getitem__(self, index: slice) -> tuple[Command, ...]: ...

    def __getitem__(self, index: int | slice) -> Command | tuple[Command, ...]:
        return self.commands[index]

    def __eq__(self, other: object) -> bool:
        if type(other) is PackedBatch:
            return self.packed == other.packed or self.commands == other.commands
        if isinstance(other, tuple):
            return self.commands == other
        return NotImplemented

    def __hash__(self) -> int:
        return hash(self.commands)  # the tuple's: equal batches hash alike

    def __repr__(self) -> str:
        return repr(self.commands)  # as the tuple: traces and messages print the same
