"""A forged batch inside a ``CAccept`` (commands that do not decode) reaching real SDPaxos
cores as the node hands it over (``decode_frame(..., lazy_batches=True)``): the acceptors log
the bytes they received, acknowledge, execute the batch as empty alike, never raise, and the
cluster goes on ordering and executing what comes next."""

from __future__ import annotations

import msgpack
from util import Net, cmd, config

from consensus.codec import FORMAT_VERSION, TAGS, decode_frame
from consensus.messages import CAccept, CAcceptedRecord
from consensus.packed_batch import PackedBatch


def forged(accept: CAccept) -> CAccept:
    """``accept`` with its batch's bytes replaced by commands whose seq is negative."""
    commands = [[command.client_id, -1, command.op, list(command.keys), command.blind]
                for command in accept.batch]
    frame = msgpack.packb([FORMAT_VERSION, [[
        TAGS[CAccept], accept.src, accept.view, accept.owner, accept.index, accept.ballot,
        commands,
    ]]], use_bin_type=True)
    [message] = decode_frame(frame, lazy_batches=True)
    assert isinstance(message, CAccept) and isinstance(message.batch, PackedBatch)
    return message


def test_a_forged_batch_executes_as_empty_at_every_acceptor_and_the_cluster_goes_on() -> None:
    net = Net(config(3), trace=False)
    net.propose(1, *(cmd(7, seq, op=b"%040d" % seq, keys=(f"k{seq}",)) for seq in range(40)))
    accepts = [flight for flight in net.bag if isinstance(flight.message, CAccept)]
    assert {flight.dst for flight in accepts} == {0, 2}
    for flight in accepts:
        flight.message = forged(flight.message)  # type: ignore[arg-type]
    net.run()
    for acceptor in (0, 2):
        [record] = [r for r in net.durable[acceptor] if isinstance(r, CAcceptedRecord)]
        assert isinstance(record.batch, PackedBatch)  # logged as the bytes received
        assert record.batch == () and record.batch.malformed
        assert net.executed_ids(acceptor) == []
    net.propose(2, cmd(9, 0, keys=("x",)), cmd(9, 1, keys=("y",)))
    net.run()
    for acceptor in (0, 2):
        assert [(client, seq) for _, client, seq in net.executed_ids(acceptor)] == [(9, 0), (9, 1)]
    assert net.executed_ids(0) == net.executed_ids(2)
    assert net.executed_ids(1)[-2:] == net.executed_ids(0)  # the same slots at the leader
