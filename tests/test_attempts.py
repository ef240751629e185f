"""``consensus.attempts``: what a client may conclude from one request's attempts (issue 39).

The rules are a table (the module's header); each row is a test here, and the broken variant
that trusts every definite failure (``trust_definite``) is shown to give the wrong answer in
the case that failed in the field: a definite failure after an attempt whose fate is unknown.
"""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from consensus.attempts import Answer, Attempts, Kind, Step

OK, REFUSED, UNKNOWN, UNSENT = Answer.OK, Answer.REFUSED, Answer.UNKNOWN, Answer.UNSENT
EXPIRED = Answer.EXPIRED


def steps(attempts: Attempts, answers: list[Answer]) -> list[Step]:
    return [attempts.after(answer) for answer in answers]


def command(limit: int | None = 3, settle_limit: int | None = 3, **kw: bool) -> Attempts:
    return Attempts(Kind.COMMAND, limit, settle_limit, **kw)


def test_a_result_ends_the_request_whatever_came_before() -> None:
    assert steps(command(), [OK]) == [Step.DONE]
    assert steps(command(), [UNKNOWN, UNSENT, OK]) == [Step.RETRY, Step.RETRY, Step.DONE]


def test_a_refusal_of_the_only_copy_is_final() -> None:
    assert steps(command(), [REFUSED]) == [Step.DONE]
    # attempts that never left leave no copy behind
    assert steps(command(), [UNSENT, UNSENT, REFUSED]) == [Step.RETRY, Step.RETRY, Step.DONE]


def test_a_refusal_after_an_uncertain_attempt_is_settled() -> None:
    # the history: a timeout (a copy at the first replica may exist), then a
    # definite failure at the next: the first copy may still run, so the log decides
    attempts = command()
    assert steps(attempts, [UNKNOWN, REFUSED]) == [Step.RETRY, Step.SETTLE]
    assert attempts.settling
    assert attempts.after(REFUSED) is Step.DONE  # the cancel came first: it never ran
    settled = command()
    assert steps(settled, [UNKNOWN, REFUSED, OK]) == [Step.RETRY, Step.SETTLE, Step.DONE]


def test_trusting_every_definite_failure_is_the_bug() -> None:
    # teeth: the variant that ends the request at the refusal (what clients did before)
    attempts = command(trust_definite=True)
    assert steps(attempts, [UNKNOWN, REFUSED]) == [Step.RETRY, Step.DONE]
    assert not attempts.settling


def test_running_out_of_attempts_settles_an_uncertain_request() -> None:
    attempts = command(limit=3, settle_limit=2)
    assert steps(attempts, [UNKNOWN, UNKNOWN, UNKNOWN]) == [Step.RETRY, Step.RETRY, Step.SETTLE]
    # the cancel gets its own budget; unanswered, the outcome stays unknown
    assert steps(attempts, [UNKNOWN, UNSENT]) == [Step.SETTLE, Step.GIVE_UP]


def test_running_out_of_attempts_that_never_left_gives_up_without_settling() -> None:
    attempts = command(limit=2)
    assert steps(attempts, [UNSENT, UNSENT]) == [Step.RETRY, Step.GIVE_UP]
    assert not attempts.settling


def test_reads_change_nothing_so_any_answer_ends_them() -> None:
    read = Attempts(Kind.READ, 2, 2)
    assert steps(read, [UNKNOWN, REFUSED]) == [Step.RETRY, Step.DONE]
    assert steps(Attempts(Kind.READ, 2, 2), [UNKNOWN, UNKNOWN]) == [Step.RETRY, Step.GIVE_UP]


def test_a_membership_change_is_never_sent_twice_once_a_copy_may_exist() -> None:
    # no session table keeps changes: a second copy could apply again, a cancel stops none
    assert steps(Attempts(Kind.CHANGE, 3, 3), [UNKNOWN]) == [Step.GIVE_UP]
    assert steps(Attempts(Kind.CHANGE, 3, 3), [UNSENT, UNSENT, REFUSED]) == [
        Step.RETRY, Step.RETRY, Step.DONE]
    assert steps(Attempts(Kind.CHANGE, 3, 3), [UNSENT, OK]) == [Step.RETRY, Step.DONE]


def test_without_a_limit_a_request_is_sent_again_until_answered() -> None:
    attempts = command(limit=None, settle_limit=None)
    assert steps(attempts, [UNKNOWN] * 50) == [Step.RETRY] * 50


@given(st.lists(st.sampled_from(list(Answer)), max_size=12))
def test_a_definite_end_never_follows_an_unknown_copy_unless_the_log_settled_it(
    answers: list[Answer],
) -> None:
    """The safety rule: ``DONE`` on a refusal while a copy's fate is unknown happens only
    once the request is settled (the refusal is the cancel's answer)."""
    attempts = command()
    for answer in answers:
        uncertain, settling = attempts.uncertain, attempts.settling
        step = attempts.after(answer)
        if step is Step.DONE and answer is REFUSED:
            assert settling or not uncertain
        if step in (Step.DONE, Step.GIVE_UP):
            break


@pytest.mark.parametrize("answer", [UNKNOWN, UNSENT, REFUSED])
def test_a_settling_request_only_ever_asks_its_cancel_again(answer: Answer) -> None:
    attempts = command(settle_limit=None)
    steps(attempts, [UNKNOWN, REFUSED])
    step = attempts.after(answer)
    assert step is (Step.DONE if answer is REFUSED else Step.SETTLE)


def test_a_session_gone_ends_a_request_sent_once_and_leaves_one_sent_twice_unknown() -> None:
    # the only copy was refused for its session: it never ran (the client opens another
    # session and sends it again, as a new request)
    assert steps(command(), [EXPIRED]) == [Step.DONE]
    # an earlier copy may have run before the session went, and a cancel gets the same
    # answer: the outcome stays unknown
    assert steps(command(), [UNKNOWN, EXPIRED]) == [Step.RETRY, Step.GIVE_UP]
    settling = command()
    assert steps(settling, [UNKNOWN, REFUSED, EXPIRED]) == [Step.RETRY, Step.SETTLE,
                                                            Step.GIVE_UP]
    assert steps(Attempts(Kind.READ, 3, 3), [UNKNOWN, EXPIRED]) == [Step.RETRY, Step.DONE]
