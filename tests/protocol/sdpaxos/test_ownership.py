"""The package's rule, checked on its source: every field has one owner, and no part writes a
field another owns (they call the owner's methods); the facade stays small.

``ownership.py`` counts, statically. Before the log objects and hooks (issue 35, measured at
``83ee263``): 61 attributes on the facade, 107 (part, field) pairs written across owners.
"""

from __future__ import annotations

import textwrap
from pathlib import Path

import consensus.protocol.sdpaxos as package

from .ownership import facade_attributes, foreign_writes

PACKAGE = Path(package.__file__).parent
#: what ``SDPaxosReplica.__init__`` may assign: a few settings, the view and role, the two log
#: objects, the turn's output, the parts and the routing tables
MAX_FACADE_ATTRIBUTES = 34


def test_no_part_writes_a_field_another_part_owns() -> None:
    assert foreign_writes(PACKAGE) == {}


def test_the_facade_holds_few_attributes() -> None:
    attributes = facade_attributes(PACKAGE)
    assert len(attributes) <= MAX_FACADE_ATTRIBUTES, attributes
    for log_state in ("c", "c_high", "next_index", "unready", "o_value", "o_committed",
                      "exec_slot", "log", "peer_executed", "seq_alive_at", "reproposing"):
        assert log_state not in attributes


def test_the_count_sees_writes_through_the_facade_aliases_and_records(tmp_path: Path) -> None:
    # teeth: a part that writes the facade's field, another part's, and a C-instance's value
    (tmp_path / "facade.py").write_text(textwrap.dedent('''
        class SDPaxosReplica:
            def __init__(self):
                self.view = 0
                self.c_store = CStore(3)
                self.other = Other(self)
                self.bad = Bad(self)
    '''))
    (tmp_path / "parts.py").write_text(textwrap.dedent('''
        class CStore:
            def __init__(self, n):
                self._instances = {}
        class Other:
            def __init__(self, r):
                self.r = r
                self.pending = {}
            def own(self):
                self.pending[1] = 2
        class Bad:
            def __init__(self, r):
                self.r = r
            def step(self):
                r = self.r
                r.view = 1
                r.other.pending.pop(1)
                inst = r.c_store.get((0, 0))
                inst.ballot = 3
                inst.sent_at = 4
                for slots in r.other.pending.values():
                    slots.base = 0
    '''))
    assert facade_attributes(tmp_path) == ["view", "c_store", "other", "bad"]
    assert foreign_writes(tmp_path) == {
        "Bad": {"SDPaxosReplica.view", "Other.pending", "CStore.CInstance.ballot",
                "CPhase.CInstance.sent_at"},
    }
