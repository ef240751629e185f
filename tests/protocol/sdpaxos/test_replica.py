"""The facade (replica.py): the driver contract of ``ready`` and ``advance``.
"""

from __future__ import annotations

import pytest
from util import core

from consensus.errors import LocalProtocolError
from consensus.protocol.ready import Ready

from .builders import A

# =========================================================================== driver contract


def test_ready_twice_without_advance_raises() -> None:
    r1 = core(3, 1)
    r1.propose(A, 0)
    first = r1.ready()
    with pytest.raises(LocalProtocolError):
        r1.ready()
    with pytest.raises(LocalProtocolError):
        r1.advance(Ready())
    r1.advance(first)
    with pytest.raises(LocalProtocolError):
        r1.advance(first)
    assert r1.ready().is_empty()
