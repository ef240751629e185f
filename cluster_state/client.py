"""``AllocationStore``: the scheduler's API to the replicated GPU allocation store.

One class, two ways in, the same calls:

* ``AllocationStore.connect(addresses, client_id=..., home=...)`` — remote, over the native
  client protocol to the replica at the scheduler's own site (retried on another replica with
  the same (client id, sequence number) after a timeout, so a retry takes effect once);
* ``AllocationStore.embedded(node, client_id=...)`` — a scheduler process that hosts a replica
  (``consensus.runtime.node.ReplicaNode`` serving a ``ClusterStore``) calls it directly; a
  request that times out is proposed again with the same (client id, sequence number).

Updates (``submit``, ``bind``, ``release``, ``set_node_health``, ``reconfigure``) go through
the log and are linearizable; queries (``status``, ``vc``, ``summary``, ``allocations``,
``inspect``, ``plan_reconfiguration``) are linearizable reads through the sequencer unless
``stale=True`` asks for the local replica's state.

``watch(r)`` yields every change event after revision ``r`` in order, exactly once, pushed
(no polling). Embedded, it is fed by the node's apply hook and the store's own event log;
remote, by the replicas' gRPC stream (``cluster_state.pushed_watch``: every watcher of the
process, of every store connected to the same replicas, shares one ``WatchAcked`` stream per
replica; batches pushed as commands apply, acknowledged as the process hands them out so a
replica never sends far ahead of a process that stopped reading, resumed at the next replica
if the stream breaks), so a remote store that watches needs the replicas' gRPC addresses:
``connect(..., watch_targets=[grpc host:port, ...])``. Either way a watcher that lost its
connection resumes with ``watch(last.revision)`` — at any replica, since every replica holds
the same events — and if the store no longer keeps them, or the caller read too slowly and
was dropped, it raises ``EventsCompacted``: re-read the state with ``allocations()`` and watch
from the ``revision`` that list carries (list-then-watch misses and repeats nothing).
``watch(from_now=True)`` starts at the store's revision now, read linearizably, at whichever
replica serves it.

A store answer ``["error", reason]`` raises ``InvalidRequest`` (nothing changed) —
``NotFound``, a subclass, when the call names a group or VC the store does not hold (``release``
of a group released before is no error: ``Released.already_released``); an answer that may or
may not have taken effect raises ``consensus.errors.IndefiniteFailure``.

``AllocationStore`` is an async context manager (``async with AllocationStore.embedded(node)
as store``) that closes what the store opened: the remote client's connections, its watch
channels, an embedded store's open watches (their apply hooks).

A session is one ``client_id``: the replicated session table remembers its recent results by
sequence number, so a client id must not be reused by another session (a restarted scheduler
included). Leave it out to get a random one. The table evicts sessions idle for long or over
its caps (``consensus.sessions``): a store opens a new one by itself when an update it had
sent nowhere before finds its session gone (it never ran). A caller that numbers its own
updates (``seq=``) numbers them with ``consensus.sessions.session_seq`` to get a session the
table may evict; small numbers (from 0) make a pinned session, kept for good.

    store = AllocationStore.connect([("10.0.0.1", 7100), ...], home=0)
    result = await store.submit(GroupSpec(name="job-1", vc="vc00", priority=100,
                                          members=(Member(pods=2, leaves=8),)))
    if isinstance(result, Placed):
        ...  # result.pods: Pod(leaves, node, devices) per pod; result.token: fencing token
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncGenerator, Awaitable, Callable, Iterable, Sequence
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

import msgpack

from cluster_state import ops
from cluster_state.config import parse_config
from cluster_state.errors import ClusterStateError, InvalidRequest, NotFound
from cluster_state.events import ChangeEvent
from cluster_state.ops import GroupSpec, Member, Pod, PodPlacement
from cluster_state.pushed_watch import PushedWatch
from cluster_state.store import ClusterStore
from cluster_state.watch_hub import ACK_WINDOW
from consensus.attempts import Answer, Attempts, Step
from consensus.attempts import Kind as AttemptKind
from consensus.errors import (
    ConfigError,
    DefiniteFailure,
    IndefiniteFailure,
    SDPaxosError,
    SessionExpired,
)
from consensus.messages import Command
from consensus.runtime.client import new_client_id
from consensus.runtime.cluster_config import parse_address
from consensus.runtime.members import address_text
from consensus.sessions import CANCEL_OP, SessionNumbers

if TYPE_CHECKING:
    import ssl

    import grpc

    from consensus.auth import Principal
    from consensus.runtime.node import ReplicaNode
    from consensus.runtime.turns import ApplyHook

__all__ = [
    "ACK_WINDOW",
    "AllocationStore",
    "Allocations",
    "InvalidRequest",
    "Member",
    "NotFound",
    "Pod",
    "PodPlacement",
    "PushedWatch",
    "new_client_id",
]

#: the codec's bound on a client id (and a sequence number)
_MAX_ID = (1 << 63) - 1
#: a revision no event reaches: asked for the events after it, a read answers only the
#: revision it read at
_NO_EVENTS_AFTER = _MAX_ID
#: an update refused because a new cluster's log holds no configuration yet is sent again
#: after this long (doubled each time), for this long at most (seconds)
NOT_CONFIGURED_RETRY_S = 0.05
NOT_CONFIGURED_WAIT_S = 15.0
#: how often a remote store asks for the current members (seconds; ``connect``)
MEMBER_SYNC_S = 30.0

_T = TypeVar("_T")


class _Channel(Protocol):
    """How a store reaches the log: the remote client or a node in this process."""

    async def update(self, op: bytes, seq: int | None) -> bytes: ...

    async def query(self, op: bytes, stale: bool) -> bytes: ...

    def watch(self, since: int, poll_s: float, from_now: bool
              ) -> AsyncGenerator[Sequence[ChangeEvent], None]: ...

    async def close(self) -> None: ...


class _Remote:
    def __init__(self, addresses: Sequence[tuple[str, int]], client_id: int, home: int,
                 timeout_s: float, attempts: int, watch_targets: Sequence[str] = (),
                 tls: ssl.SSLContext | None = None,
                 watch_credentials: grpc.ChannelCredentials | None = None,
                 sync_every_s: float | None = None) -> None:
        from consensus.runtime.client import Client

        self.client = Client(client_id, list(addresses), home=home, timeout_s=timeout_s,
                             attempts=attempts, tls=tls, sync_every_s=sync_every_s)
        self.home = home
        self._watch_credentials = watch_credentials
        self.pushed = (PushedWatch.shared(watch_targets, credentials=watch_credentials)
                       if watch_targets else None)

    async def _pushed(self) -> PushedWatch:
        """The pushed watch: over the targets given, else over the current members' gRPC
        addresses (the voters', the home replica's first), learnt from the replicas."""
        if self.pushed is None:
            members = self.client.synced_members if self.client.synced_members is not None else (
                await self.client.sync())
            home = self.client.addresses[0]
            voters = [(m.info.client_address != home, address_text(m.info.grpc_address))
                      for m in members or () if m.voter and m.info is not None
                      and m.info.grpc_address is not None]
            targets = [target for _, target in sorted(voters, key=lambda v: v[0])]
            if not targets:
                raise ConfigError("a remote watch is pushed by the replicas' gRPC service: "
                                  "connect with watch_targets=[their grpc host:port, ...] "
                                  "(the members name no gRPC address)")
            self.pushed = PushedWatch.shared(targets, credentials=self._watch_credentials)
        return self.pushed

    async def update(self, op: bytes, seq: int | None) -> bytes:
        reply = await self.client.execute(op, seq=seq)
        return bytes(reply.payload)  # type: ignore[arg-type]

    async def query(self, op: bytes, stale: bool) -> bytes:
        reply = await self.client.read(op, stale=stale)
        return bytes(reply.payload)  # type: ignore[arg-type]

    async def watch(self, since: int, poll_s: float, from_now: bool
                    ) -> AsyncGenerator[Sequence[ChangeEvent], None]:
        given = self.pushed is not None
        pushed = await self._pushed()
        async with contextlib.aclosing(
            pushed.watch(since, self.home if given else 0, from_now=from_now)
        ) as pages:
            async for page in pages:
                yield page

    async def close(self) -> None:
        await self.client.close()
        if self.pushed is not None:
            await self.pushed.close()


class _Embedded:
    def __init__(self, node: ReplicaNode, client_id: int, timeout_s: float,
                 attempts: int, principal: Principal | None = None) -> None:
        if not isinstance(node.state_machine, ClusterStore):
            raise TypeError("AllocationStore.embedded needs a node serving a ClusterStore, not "
                            f"{type(node.state_machine).__name__}")
        self.node = node
        self.store: ClusterStore = node.state_machine
        self.client_id = client_id
        self.timeout_s = timeout_s
        self.attempts = attempts
        #: on whose behalf (a TLS cluster's gRPC caller), checked as the commands apply
        self.principal = principal
        self._numbers = SessionNumbers()
        #: the apply hooks of this store's open watches, each with the event that wakes it
        self._watches: dict[ApplyHook, asyncio.Event] = {}
        self._closed = False

    def _command(self, op: bytes, seq: int | None = None) -> Command:
        return Command(client_id=self.client_id,
                       seq=self._numbers.next() if seq is None else seq, op=op)

    async def update(self, op: bytes, seq: int | None) -> bytes:
        # After a timeout (a failover, say) the command may or may not be in the log:
        # proposing the same (client id, seq) again is safe, the session table applies it
        # once. What an answer means for the request follows ``consensus.attempts``, as with
        # the remote client: a definite failure after an attempt whose fate is unknown, and
        # running out of attempts, settle the request through the log. SessionExpired for a
        # command numbered here and proposed once: it never ran, so it is proposed again,
        # once, in a new session (``consensus.runtime.client`` does the same).
        renewed = False
        while True:
            command = self._command(op, seq)
            try:
                return await self._attempted(command)
            except SessionExpired as exc:
                if seq is not None or renewed:
                    raise
                self._numbers.renew(exc.log_time)
                renewed = True

    async def _attempted(self, command: Command) -> bytes:
        """``command``'s result, attempt after attempt as ``Attempts`` rules."""
        request = command
        attempts = Attempts(AttemptKind.COMMAND, self.attempts, self.attempts)
        error: SDPaxosError | None
        while True:
            try:
                async with asyncio.timeout(self.timeout_s):
                    result = await self.node.submit(request, principal=self.principal)
                return result.value
            except TimeoutError:
                answer, error = Answer.UNKNOWN, None
            except IndefiniteFailure as exc:
                answer, error = Answer.UNKNOWN, exc
            except SessionExpired as exc:
                answer, error = Answer.EXPIRED, exc
            except DefiniteFailure as exc:
                answer, error = Answer.REFUSED, exc
            step = attempts.after(answer)
            if step is Step.DONE:
                assert error is not None
                raise error
            if step is Step.GIVE_UP and answer is Answer.EXPIRED:
                raise IndefiniteFailure(
                    f"({command.client_id}, {command.seq}) may have been applied before its "
                    f"session expired (it will not be from now on): {error}") from error
            if step is Step.GIVE_UP:
                raise IndefiniteFailure(
                    f"no result for ({command.client_id}, {command.seq}) within "
                    f"{self.timeout_s}s, {self.attempts} tries, nor a settled outcome"
                )
            if step is Step.SETTLE and request is command:
                request = Command(client_id=command.client_id, seq=command.seq, op=CANCEL_OP)

    async def query(self, op: bytes, stale: bool) -> bytes:
        return await self._retried(
            lambda: self.node.read(self._command(op), stale=stale, principal=self.principal),
            "no answer to a read",
        )

    async def _retried(self, call: Callable[[], Awaitable[_T]], what: str) -> _T:
        for _ in range(self.attempts):
            with contextlib.suppress(TimeoutError):
                async with asyncio.timeout(self.timeout_s):
                    return await call()
        raise IndefiniteFailure(f"{what} within {self.timeout_s}s, {self.attempts} tries")

    async def watch(self, since: int, poll_s: float, from_now: bool
                    ) -> AsyncGenerator[Sequence[ChangeEvent], None]:
        # The node calls its apply hooks on its own loop, right after each command applies:
        # a set flag is all a waiting watcher needs, and it reads the events locally.
        changed = asyncio.Event()

        def wake(position: int, commands: Sequence[Command], results: Sequence[bytes]) -> None:
            changed.set()

        if self._closed:
            raise ClusterStateError("this AllocationStore is closed")
        if from_now:  # a linearizable read: this replica has applied through it since
            since = _revision_of(await self.query(ops.get_events(_NO_EVENTS_AFTER), False))
        self.node.on_apply.append(wake)
        self._watches[wake] = changed
        try:
            while not self._closed:
                changed.clear()
                events = self.store.events_since(since)  # EventsCompacted if gone
                if events:
                    yield events
                    since = events[-1].revision
                    continue
                # A snapshot installed from a peer calls no hook: look again now and then.
                with contextlib.suppress(TimeoutError):
                    async with asyncio.timeout(max(poll_s, 1.0)):
                        await changed.wait()
        finally:
            self._unhook(wake)

    def _unhook(self, wake: ApplyHook) -> None:
        if self._watches.pop(wake, None) is not None:
            with contextlib.suppress(ValueError):
                self.node.on_apply.remove(wake)

    async def close(self) -> None:
        # What this store started: its watches' hooks (a watch generator nobody closed
        # would keep its hook on the node). Their generators end when next resumed.
        self._closed = True
        for wake, changed in list(self._watches.items()):
            self._unhook(wake)
            changed.set()


class AllocationStore:
    """One session with the allocation store (see the module documentation)."""

    __slots__ = ("_channel", "client_id")

    def __init__(self, channel: _Channel, client_id: int) -> None:
        self._channel = channel
        self.client_id = client_id

    @classmethod
    def connect(
        cls,
        addresses: Sequence[tuple[str, int] | str],
        *,
        client_id: int | None = None,
        home: int = 0,
        timeout_s: float = 2.0,
        attempts: int = 3,
        watch_targets: Sequence[str] = (),
        tls: ssl.SSLContext | None = None,
        watch_credentials: grpc.ChannelCredentials | None = None,
        sync_every_s: float | None = MEMBER_SYNC_S,
    ) -> AllocationStore:
        """Talk to the replicas at ``addresses`` (client ports: ``"host:port"`` strings or
        ``(host, port)`` pairs; anything else raises ``ConfigError``), ``addresses[home]`` first.
        A request unanswered for ``timeout_s`` goes to the next replica, ``attempts`` times.
        The addresses are where the store starts: it follows the current members
        (``consensus.runtime.client.Client.sync``: before its first request, every
        ``sync_every_s`` and after a request nobody answered; None: only ``addresses``), the
        home replica first while it votes.
        ``watch`` uses the replicas' pushed gRPC stream: ``watch_targets`` (their gRPC
        host:port, in the same order, ``watch_targets[home]`` first), else the current
        voters' gRPC addresses. A TLS cluster: ``tls``
        (``config.tls.tool()`` or a scheduler's ``consensus.runtime.tls.client_context``) and,
        with ``watch_targets``, ``watch_credentials``; what the certificate names is what the
        session may do (``cluster_state.authz``; a refusal raises ``PermissionDenied``)."""
        client_id = _checked_id(client_id)
        pairs = [_client_address(address) for address in addresses]
        return cls(_Remote(pairs, client_id, home, timeout_s, attempts, watch_targets,
                           tls, watch_credentials, sync_every_s), client_id)

    @classmethod
    def embedded(
        cls,
        node: ReplicaNode,
        *,
        client_id: int | None = None,
        timeout_s: float = 5.0,
        attempts: int = 3,
        principal: Principal | None = None,
    ) -> AllocationStore:
        """Use the replica ``node`` (a started ``ReplicaNode`` serving a ``ClusterStore``)
        hosted in this process. A request with no outcome after ``timeout_s`` is proposed
        again, ``attempts`` times. ``principal``: on whose behalf, in a TLS cluster (None:
        this process's own, unchecked)."""
        client_id = _checked_id(client_id)
        return cls(_Embedded(node, client_id, timeout_s, attempts, principal), client_id)

    async def close(self) -> None:
        await self._channel.close()

    async def __aenter__(self) -> AllocationStore:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.close()

    # ------------------------------------------------------------------ updates
    # ``seq`` is for callers that number their own requests (so they can retry one after
    # they restart, say); by default the session numbers them. Don't mix the two.

    async def submit(
        self, spec: GroupSpec, *, seq: int | None = None,
        suggested: Iterable[str] | None = None,
    ) -> ops.Placed | ops.Preempting | ops.Waiting:
        """Place the gang ``spec``: placed, reserving cells from lower-priority victims
        (placed once they are released), or waiting (nothing changed; try again later).
        ``suggested``: inside these nodes only (see ``cluster_state.ops``; a preemption of
        ``spec`` whose nodes left them is cancelled and planned again)."""
        op = ops.submit(spec.name, spec.vc, spec.priority, spec.members,
                        leaf_type=spec.leaf_type, pinned=spec.pinned, lazy=spec.lazy,
                        suggested=suggested)
        result = await self._update(op, seq)
        if isinstance(result, ops.Placed | ops.Preempting | ops.Waiting):
            return result
        raise _unexpected(result)

    async def bind(
        self, spec: GroupSpec, pods: Sequence[PodPlacement], revision: int, *,
        seq: int | None = None,
    ) -> ops.Placed | ops.Conflict:
        """Place ``spec`` exactly at ``pods`` (one per pod, members in order) unless one of
        their GPUs changed after ``revision`` (a scheduler with its own placement policy)."""
        op = ops.bind(spec.name, spec.vc, spec.priority, spec.members, tuple(pods), revision,
                      leaf_type=spec.leaf_type, pinned=spec.pinned, lazy=spec.lazy)
        result = await self._update(op, seq)
        if isinstance(result, ops.Placed | ops.Conflict):
            return result
        raise _unexpected(result)

    async def release(self, name: str, *, seq: int | None = None) -> ops.Released:
        """Free the group's GPUs (or cancel its reservation); ``promoted`` lists the
        preemptors that are placed now. A group released before answers
        ``already_released`` (nothing changed); ``NotFound`` if the store knows no such
        group (see ``ClusterStore``)."""
        result = await self._update(ops.release(name), seq, lookup=True)
        if isinstance(result, ops.Released):
            return result
        raise _unexpected(result)

    async def release_if(
        self, name: str, incarnation: int, *, seq: int | None = None
    ) -> ops.Released | ops.Conflict:
        """``release`` provided the group is still ``incarnation`` (its status'): a conflict,
        changing nothing, if it is a newer group of the same name."""
        result = await self._update(ops.release_if(name, incarnation), seq, lookup=True)
        if isinstance(result, ops.Released | ops.Conflict):
            return result
        raise _unexpected(result)

    async def claim(
        self, name: str, incarnation: int, slot: int, uid: str, pod: str,
        previous: str = "", *, seq: int | None = None,
    ) -> ops.Claimed | ops.Conflict:
        """Record that pod ``uid`` ("namespace/name" ``pod``) takes member pod ``slot`` of
        group ``name`` (incarnation ``incarnation``), if ``previous`` ("" for nobody) holds it
        now; idempotent for the same pod (see ``cluster_state.ops``)."""
        result = await self._update(ops.claim(name, incarnation, slot, uid, pod, previous), seq)
        if isinstance(result, ops.Claimed | ops.Conflict):
            return result
        raise _unexpected(result)

    async def set_node_health(
        self, node: str, healthy: bool, *, seq: int | None = None
    ) -> ops.NodeHealthSet:
        """Mark a node healthy or bad (bad GPUs are not allocated; reservations on them are
        cancelled, listed in ``cancelled``)."""
        result = await self._update(ops.set_node_health(node, healthy), seq)
        if isinstance(result, ops.NodeHealthSet):
            return result
        raise _unexpected(result)

    async def reconfigure(self, config_yaml: str, *, seq: int | None = None,
                          from_file: bool = False) -> ops.Reconfigured:
        """Run a new cluster configuration (HiveD's YAML) from now on, keeping the running
        groups (see ``ClusterStore``). It is validated here first: an invalid one raises
        ``ConfigError`` and nothing is proposed. ``from_file``: a replica's configuration
        file, which changes nothing if the log ran that configuration before."""
        parse_config(config_yaml)
        result = await self._update(ops.reconfigure(config_yaml, from_file=from_file), seq)
        if isinstance(result, ops.Reconfigured):
            return result
        raise _unexpected(result)

    async def plan_reconfiguration(
        self, config_yaml: str, *, stale: bool = False
    ) -> dict[str, Any]:
        """A dry run of ``reconfigure``: ``{"changed": bool, "groups": {...}, ...}``."""
        parse_config(config_yaml)
        info: dict[str, Any] = await self._query(ops.plan_reconfigure(config_yaml), stale)
        return info

    async def plan_submit(
        self, spec: GroupSpec, *, stale: bool = False, suggested: Iterable[str] | None = None
    ) -> tuple[int, ops.Placed | ops.Preempting | ops.Waiting]:
        """A dry run of ``submit`` (nothing changes, nothing is reserved, no preemption is
        cancelled: HiveD's filtering phase): the revision it read at and what ``submit``
        would answer, inside the ``suggested`` nodes if given. A ``Placed`` answer can be
        taken with ``bind(spec, placement, revision)``, which fails if any of its GPUs
        changed since."""
        op = ops.plan_submit(spec.name, spec.vc, spec.priority, spec.members,
                             leaf_type=spec.leaf_type, pinned=spec.pinned, lazy=spec.lazy,
                             suggested=suggested)
        answer = msgpack.unpackb(await self._channel.query(op, stale))
        if answer[0] == "error":
            raise _refused(answer[1], lookup=False)
        result = ops.decode_result(msgpack.packb(answer[2]))
        if isinstance(result, ops.Error):
            raise InvalidRequest(result.reason)
        if isinstance(result, ops.Placed | ops.Preempting | ops.Waiting):
            return int(answer[1]), result
        raise _unexpected(result)

    async def _update(self, op: bytes, seq: int | None, *, lookup: bool = False) -> ops.Result:
        """``lookup``: the op names an existing group, so "no such group" is ``NotFound``. A
        new cluster's log holds no configuration for a moment (``ops.NOT_CONFIGURED``): an
        update numbered here is sent again, as a new request, for up to
        ``NOT_CONFIGURED_WAIT_S``."""
        if seq is not None and not 0 <= seq <= _MAX_ID:
            raise ValueError(f"seq must be in 0..{_MAX_ID}, got {seq}")
        deadline = asyncio.get_running_loop().time() + NOT_CONFIGURED_WAIT_S
        delay = NOT_CONFIGURED_RETRY_S
        while True:
            result = ops.decode_result(await self._channel.update(op, seq))
            if not isinstance(result, ops.Error):
                return result
            if (result.reason != ops.NOT_CONFIGURED or seq is not None
                    or asyncio.get_running_loop().time() + delay > deadline):
                raise _refused(result.reason, lookup=lookup)
            await asyncio.sleep(delay)
            delay = min(2 * delay, 1.0)

    # ------------------------------------------------------------------ queries
    async def status(self, name: str, *, stale: bool = False) -> dict[str, Any] | None:
        """The group ``name`` (state, placement — ``pods``: ``Pod`` each —, token...), or
        None if there is none."""
        _, info = await self.read_at(ops.get_group(name), stale=stale)
        return _named_pods(info) if info is not None else None

    async def vc(self, name: str, *, stale: bool = False) -> dict[str, Any]:
        """A virtual cluster's cells per level (free / used / bad) and GPU use."""
        info: dict[str, Any] = await self._query(ops.get_vc(name), stale)
        return info

    async def summary(self, *, stale: bool = False) -> dict[str, Any]:
        """Cluster-wide GPU use, per chain and per virtual cluster."""
        info: dict[str, Any] = await self._query(ops.get_summary(), stale)
        return info

    async def allocations(
        self, vc: str | None = None, *, stale: bool = False
    ) -> Allocations:
        """Every group (of ``vc``), in name order (``pods``: ``Pod`` each), and the
        ``revision`` of the store they were read at: ``watch(listing.revision)`` then yields
        exactly what changed after the list (nothing missed, nothing twice). ``NotFound``
        for a VC the store does not have."""
        revision, groups = await self.read_at(ops.list_groups(vc or ""), stale=stale)
        return Allocations((_named_pods(g) for g in groups), revision=revision)

    async def digest(self, *, stale: bool = False) -> dict[str, Any]:
        """``{"revision": r, "sha256": hex}``: the hash of the store's snapshot. Replicas that
        applied the same log agree; ask each one with ``stale=True`` to compare them."""
        info: dict[str, Any] = await self._query(ops.get_digest(), stale)
        return info

    async def inspect(self, kind: str, name: str = "", *, stale: bool = False) -> Any:
        """Cell trees, as HiveD's inspect API: ``physical`` (``name``: a chain, "" for all),
        ``vc`` (a VC's virtual cells and their physical counterparts) or ``group`` (its
        physical and virtual placement and lazy-preemption status; None if unknown)."""
        if kind not in ops.INSPECT_KINDS:
            raise ValueError(f"kind must be one of {', '.join(ops.INSPECT_KINDS)}")
        return await self._query(ops.inspect(kind, name), stale)

    async def hived_inspect(self, kind: str, name: str = "", *, stale: bool = False) -> Any:
        """HiveD's inspect API objects (``cluster_state.hived_view``): ``groups`` (an
        ``AffinityGroupList``), ``group`` ``name`` (an ``AffinityGroup``, None if unknown),
        ``cluster``, ``physical``, ``vcs``, ``vc`` ``name`` (``NotFound`` if unknown)."""
        if kind not in ops.HIVED_KINDS:
            raise ValueError(f"kind must be one of {', '.join(ops.HIVED_KINDS)}")
        return await self._query(ops.hived_inspect(kind, name), stale)

    async def revision(self, *, stale: bool = False) -> int:
        """The store's revision: the position of the last command that changed it (every
        change acknowledged before this call has one no higher, unless ``stale``: then the
        local replica's)."""
        return (await self.read_at(ops.get_events(_NO_EVENTS_AFTER), stale=stale))[0]

    async def _query(self, op: bytes, stale: bool) -> Any:
        return (await self.read_at(op, stale=stale))[1]

    async def read_at(self, op: bytes, *, stale: bool = False) -> tuple[int, Any]:
        """A query op (``cluster_state.ops.get_group`` & co) as the store answers it, and the
        revision it read at: ``(revision, info)`` (what the gRPC service serves). A refusal
        raises ``InvalidRequest`` (``NotFound`` for an unknown group, VC or cell)."""
        answer = msgpack.unpackb(await self._channel.query(op, stale))
        if answer[0] == "error":
            raise _refused(answer[1], lookup=True)
        return int(answer[1]), answer[2]

    # ------------------------------------------------------------------ watch
    async def watch(
        self, since: int = -1, *, poll_s: float = 0.05, from_now: bool = False
    ) -> AsyncGenerator[ChangeEvent, None]:
        """Every change event with a revision above ``since``, in order, once each; new ones
        as they happen, pushed (remote: ``ConfigError`` unless the store was connected with
        ``watch_targets``). ``from_now`` instead of ``since``: the changes after the revision
        the store is at now, read linearizably (``revision()``; remote: by the replica that
        serves the watch, which has applied through it first), so no change acknowledged
        before the call is among them and none after it is missed. Raises
        ``EventsCompacted`` if the store dropped some of them or this watcher read too
        slowly. ``poll_s``: how often an embedded watch looks at the store anyway (at least
        every second: a snapshot installed from a peer calls no hook).

        One operation may emit several events with the same revision (a release that places
        its preemptors, say); they come one after the other. To resume exactly after the
        last event seen, watch from that revision minus one and skip the events of that
        revision already seen (every replica emits the same events in the same order)."""
        if from_now and since != -1:
            raise ValueError("a watch starts at since or from now, not both")
        # Closing this generator closes the channel's too (and so unhooks an embedded one).
        async with contextlib.aclosing(self._channel.watch(since, poll_s, from_now)) as pages:
            async for events in pages:
                for event in events:
                    yield event


class Allocations(list[dict[str, Any]]):
    """``allocations()``'s groups (a list, as before) with the ``revision`` they were read
    at, to watch from."""

    __slots__ = ("revision",)

    def __init__(self, groups: Iterable[dict[str, Any]] = (), *, revision: int) -> None:
        super().__init__(groups)
        self.revision = revision


def _named_pods(info: dict[str, Any]) -> dict[str, Any]:
    """A group's map with its ``pods`` as ``Pod`` (named; still ``[leaves, node, devices]``
    when unpacked or written out as JSON)."""
    info["pods"] = [Pod(int(n), str(node), tuple(d)) for n, node, d in info["pods"]]
    return info


#: how the store says a request names something it does not hold (``cluster_state.allocator``)
_NOT_FOUND_PREFIXES = ("no group ", "unknown virtual cluster ", "no chain or cell address ")


def _refused(reason: str, *, lookup: bool) -> InvalidRequest:
    """The exception for a store's refusal; ``lookup``: the call names the thing to act on
    (a release, a query), so its absence is ``NotFound`` rather than a bad request."""
    if lookup and reason.startswith(_NOT_FOUND_PREFIXES):
        return NotFound(reason)
    return InvalidRequest(reason)


def _client_address(address: tuple[str, int] | str) -> tuple[str, int]:
    """``"host:port"`` or ``(host, port)`` as a pair; ``ConfigError`` for anything else."""
    if isinstance(address, str):
        return parse_address(address, "replica client address")
    if (
        isinstance(address, tuple) and len(address) == 2 and isinstance(address[0], str)
        and isinstance(address[1], int) and 0 < address[1] < 65536
    ):
        return address
    raise ConfigError(f"replica client address: expected \"host:port\" or (host, port), got "
                      f"{address!r}")


def _revision_of(answer: bytes) -> int:
    """The revision a query's answer was read at (``["error", reason]``: refused)."""
    decoded = msgpack.unpackb(answer)
    if decoded[0] == "error":
        raise _refused(decoded[1], lookup=False)
    return int(decoded[1])


def _checked_id(client_id: int | None) -> int:
    if client_id is None:
        return new_client_id()
    if not 0 <= client_id <= _MAX_ID:
        raise ValueError(f"client_id must be in 0..{_MAX_ID}, got {client_id}")
    return client_id


def _unexpected(result: ops.Result) -> ClusterStateError:
    # The store answered an update with the result of another kind of operation: a bug, not
    # a request the caller could fix.
    return ClusterStateError(f"unexpected answer {result!r}")
