"""One request's attempts, and what its client may conclude from them (sans-I/O).

A client sends a request — one ``(client id, seq)`` — to a replica and, when it hears
nothing back in time or loses the connection, again to the next one. Every attempt that left
may put a copy of the request into some replica's instance, and any copy may still be
chosen and executed after the client moved on: the session table on the replicated state
machine makes sure only the first copy in the log takes effect, and answers every later
copy with the first one's result (``consensus.statemachine``). So what one attempt's answer
says about the *request* depends on the attempts before it. ``Attempts`` keeps that account
and says what to do after each answer; the native client (``consensus.runtime.client``), the
embedded store (``cluster_state.client``) and the simulator's clients all follow it.

Rules (``Attempts.after``), for a request that changes state (``Kind.COMMAND``):

==================  ============================  ==========================================
answer              no earlier attempt uncertain  some earlier attempt uncertain
==================  ============================  ==========================================
``OK``              done: its result              done: its result (the first copy's, by
                                                  the session table)
``REFUSED``         done: it failed for good      settle: this copy will never run, but an
                                                  earlier one may
``UNKNOWN``         retry at the next replica (uncertain from now on); after ``limit``
                    attempts, settle
``UNSENT``          retry at the next replica; after ``limit`` attempts, give up (nothing
                    was sent: it did not and cannot take effect) or settle if uncertain
``EXPIRED``         done: it failed for good      give up: an earlier copy may have run
                    (its session is gone: the     before the session went, and a cancel
                    client opens another)         gets the same answer
==================  ============================  ==========================================

*Settling* sends ``CANCEL_OP`` under the request's own ``(client id, seq)``: whichever copy
comes first in the log decides, so the cancel's answer is the request's outcome — its result
if a copy executed, or ``CANCELLED`` (a definite failure: it never took effect and, the
session table remembering it, never will). A settle that gets no answer is retried like a
request (its own budget); if none ever comes the request ends indefinite.

Why it is exact: a definite failure is final only when no attempt but the refused one can
have left a copy (no earlier attempt uncertain), or when the log itself ordered the cancel
before every copy. An ``UNSENT`` attempt (the connection could not be opened) left nothing.

Reads change nothing (``Kind.READ``): any answer ends them, and running out of attempts is
an indefinite failure that costs nothing. Membership changes (``Kind.CHANGE``) are applied
by the membership layer, which keeps no session table: a second copy would be applied again
(a second learner added) or refused (a member removed twice), and a cancel would not stop
them. So a change is sent again only after attempts that never left, and an attempt with no
answer ends it indefinite (``sdpaxos member list`` tells what happened).

Broken on purpose for the teeth test (``trust_definite``): a definite failure ends the
request whatever came before, as every client did before issue 39.
"""

from __future__ import annotations

import enum
from dataclasses import dataclass

__all__ = ["Answer", "Attempts", "Kind", "Step"]


class Answer(enum.Enum):
    """What one attempt (or one settle) got."""

    #: a result: the request's outcome
    OK = "ok"
    #: a definite failure: this copy never took effect and never will
    REFUSED = "refused"
    #: an indefinite failure, no answer in time, or the connection lost after the request
    #: left: a copy may exist
    UNKNOWN = "unknown"
    #: the request's session is gone (evicted or closed: ``consensus.sessions``): this copy
    #: never runs, nor any later one; an earlier copy may have run before it went, and a
    #: cancel cannot tell (it gets the same answer)
    EXPIRED = "expired"
    #: the request never left (no connection could be opened)
    UNSENT = "unsent"


class Step(enum.Enum):
    """What to do next."""

    #: the answer is the request's outcome: return the result, or raise the refusal
    DONE = "done"
    #: send the request again, same (client id, seq), to the next replica
    RETRY = "retry"
    #: send a cancel under the request's (client id, seq) (to the next replica); its answer
    #: is the request's outcome
    SETTLE = "settle"
    #: raise ``IndefiniteFailure``: the outcome is unknown
    GIVE_UP = "give up"


class Kind(enum.Enum):
    COMMAND = "command"  # changes the state machine's state; the session table settles it
    CHANGE = "change"  # a membership change: no session table, cannot be settled
    READ = "read"  # changes nothing


@dataclass(slots=True)
class Attempts:
    """The account of one request's attempts (see the module documentation)."""

    kind: Kind
    #: attempts at the request before it is settled (or given up); None: no limit
    limit: int | None
    #: attempts at its cancel, once settling, before giving up; None: no limit
    settle_limit: int | None
    #: ``trust_definite``: the broken variant (a definite failure always ends it)
    trust_definite: bool = False
    #: attempts made so far (of the request, then of the cancel)
    made: int = 0
    #: some attempt may have left a copy whose fate is unknown
    uncertain: bool = False
    #: the attempts are now the cancel's
    settling: bool = False

    def after(self, answer: Answer) -> Step:
        """Account for the last attempt's answer; what to do next."""
        if answer is Answer.OK:
            return Step.DONE
        if answer is Answer.REFUSED:
            if self.settling or not self.uncertain or self.kind is Kind.READ:
                return Step.DONE
            return Step.DONE if self.trust_definite else self._unsure()
        if answer is Answer.EXPIRED:  # settling cannot help: the cancel's session is gone too
            uncertain = self.uncertain or self.settling
            return Step.GIVE_UP if uncertain and self.kind is not Kind.READ else Step.DONE
        if answer is Answer.UNKNOWN:
            self.uncertain = True
            if self.kind is Kind.CHANGE:
                return Step.GIVE_UP  # no second copy: nothing would apply it only once
        self.made += 1
        limit = self.settle_limit if self.settling else self.limit
        if limit is None or self.made < limit:
            return Step.SETTLE if self.settling else Step.RETRY
        if self.settling or not self.uncertain or self.kind is Kind.READ:
            return Step.GIVE_UP
        return self._unsure()

    def _unsure(self) -> Step:
        """A copy may exist and nothing more will be learned by asking it again: settle."""
        if self.kind is not Kind.COMMAND:
            return Step.GIVE_UP
        self.settling = True
        self.made = 0
        return Step.SETTLE
