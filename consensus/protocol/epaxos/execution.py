"""EPaxos execution: a committed instance runs once everything it reaches through its
dependencies (and its owner's previous instance) is committed; Tarjan's algorithm, iteratively
(no recursion limit), finds the strongly connected components, each run in
``(seq, owner, index)`` order, dependencies first."""

from __future__ import annotations

from typing import TYPE_CHECKING

from consensus.messages import Command
from consensus.protocol.epaxos.state import COMMITTED, Instance, InstanceId
from consensus.protocol.ready import Ready, SlotBatch
from consensus.protocol.slotlog import Key, key_of

__all__ = ["ExecutionMixin"]


class ExecutionMixin:
    """The execution part of ``EPaxosReplica`` (which provides the state declared here)."""

    if TYPE_CHECKING:
        n: int
        me: int
        exec_slot: int
        exec_counts: list[int]
        instances: dict[InstanceId, Instance]
        _exec_uncommitted: bool
        _out: Ready
        _mine: dict[Key, Command]
        _inflight: dict[Key, int]
        _reads: set[Key]
        _unready: set[Key]

        def _wait_for(self, iid: InstanceId) -> None: ...

    # ------------------------------------------------------------------ execution
    def _successors(self, iid: InstanceId, inst: Instance) -> list[InstanceId]:
        owner, index = iid
        out: list[InstanceId] = []
        if index - 1 >= self.exec_counts[owner]:
            out.append((owner, index - 1))
        for r, high in enumerate(inst.deps):
            if high >= self.exec_counts[r] and (r, high) != iid:
                out.append((r, high))
        return out

    def _execute(self) -> None:
        progress = True
        while progress:
            progress = False
            for owner in range(self.n):
                iid = (owner, self.exec_counts[owner])
                inst = self.instances.get(iid)
                if inst is not None and inst.status == COMMITTED and self._run_from(iid):
                    progress = True

    def _runnable(self, iid: InstanceId) -> Instance | None:
        inst = self.instances.get(iid)
        if inst is None or inst.status != COMMITTED:
            return None
        return inst

    def _run_from(self, root: InstanceId) -> bool:
        """Tarjan's algorithm from ``root``, iteratively: run every strongly connected
        component as soon as it is complete (its dependencies ran before it). False if an
        instance it reaches is not committed here yet (the components found so far ran)."""
        index_of: dict[InstanceId, int] = {}
        low: dict[InstanceId, int] = {}
        on_stack: set[InstanceId] = set()
        stack: list[InstanceId] = []
        counter = 0
        ran = False
        root_inst = self._runnable(root)
        if root_inst is None:
            return False
        work: list[tuple[InstanceId, list[InstanceId]]] = []

        def visit(iid: InstanceId, inst: Instance) -> None:
            nonlocal counter
            index_of[iid] = low[iid] = counter
            counter += 1
            stack.append(iid)
            on_stack.add(iid)
            work.append((iid, self._successors(iid, inst)))

        visit(root, root_inst)
        while work:
            iid, successors = work[-1]
            if successors:
                nxt = successors.pop()
                if nxt in index_of:
                    if nxt in on_stack and index_of[nxt] < low[iid]:
                        low[iid] = index_of[nxt]
                    continue
                inst = self.instances.get(nxt)
                if inst is not None and inst.executed:
                    continue
                if inst is None or inst.status != COMMITTED:
                    if self._exec_uncommitted:
                        continue  # unsafe: as if the dependency did not exist
                    self._wait_for(nxt)
                    return ran
                visit(nxt, inst)
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                if low[iid] < low[parent]:
                    low[parent] = low[iid]
            if low[iid] == index_of[iid]:
                component: list[InstanceId] = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == iid:
                        break
                self._run_component(component)
                ran = True
        return ran

    def _run_component(self, component: list[InstanceId]) -> None:
        order = sorted(component, key=lambda iid: (self.instances[iid].seq, iid[0], iid[1]))
        for iid in order:
            inst = self.instances[iid]
            inst.executed = True
            for command in inst.batch:
                key = key_of(command)
                led_here = self._mine.pop(key, None) is not None
                if iid[0] == self.me and self._inflight.get(key) == iid[1]:
                    del self._inflight[key]
                if key in self._reads:
                    self._reads.discard(key)
                    self._out.reads.append(command)
                if key in self._unready and led_here:
                    self._unready.discard(key)
                    self._out.ready.append(command)
                self._out.apply.append(SlotBatch(self.exec_slot, 0, (command,), led_here))
                self.exec_slot += 1
        for owner in sorted({iid[0] for iid in component}):
            while True:
                nxt = self.instances.get((owner, self.exec_counts[owner]))
                if nxt is None or not nxt.executed:
                    break
                self.exec_counts[owner] += 1
