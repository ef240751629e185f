"""One test per interaction script (``testdata/*.txt``): run it through a fresh
``InteractionEnv`` and compare every block's output with the expected one.

A failure shows the unified diff between the script and what the core printed. To accept a
change of behaviour, rewrite the scripts (``SDPAXOS_REWRITE=1 pytest tests/protocol/interaction``
or ``pytest tests/protocol/interaction --rewrite``) and review the diff against the comments.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from .datadriven import Block, ScriptError, diff, rewrite_requested, run_script
from .env import InteractionEnv

TESTDATA = Path(__file__).parent / "testdata"
SCRIPTS = sorted(TESTDATA.glob("*.txt"))


def _rewrite(config: pytest.Config) -> bool:
    return rewrite_requested() or bool(config.getoption("--rewrite", default=False))


@pytest.mark.parametrize("path", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_script(path: Path, pytestconfig: pytest.Config) -> None:
    env = InteractionEnv()
    expected, actual = run_script(path, env.handle)
    if _rewrite(pytestconfig):
        if actual != expected:
            path.write_text(actual)
        return
    assert actual == expected, "script output differs:\n" + diff(expected, actual, path.name)


def test_an_acceptor_that_learns_from_an_early_accept_diverges() -> None:
    # teeth of early_accept_crash_3: counting the proposer's acceptance from its Accept
    # (which left before that acceptance was durable, and was lost with the crash), replica 2
    # learns b=2 chosen and executes it where the others execute the recovery's no-op
    _, fixed = run_script(TESTDATA / "early_accept_crash_3.txt", InteractionEnv().handle)
    broken_env = InteractionEnv(unsafe=frozenset({"learn_from_accept"}))
    _, broken = run_script(TESTDATA / "early_accept_crash_3.txt", broken_env.handle)
    def logs(output: str) -> list[str]:
        final = output.split("dump all")[-1]
        return [line.strip() for line in final.splitlines() if line.strip().startswith("log:")]

    assert logs(fixed) == ["log: 0:[a=1] 1:[] 2:[] 3:[c=3]"] * 3
    assert logs(broken) == ["log: 0:[a=1] 1:[] 2:[] 3:[c=3]"] * 2 + ["log: 0:[a=1] 1:[b=2]"]


def test_a_restart_that_ignores_its_reservation_reuses_an_index_it_sent() -> None:
    # teeth of early_accept_crash_3: without its reservation, restarted replica 1 proposes
    # c=3 at index 1, at the ballot its lost CAccept of b=2 had there (replica 2 holds b=2)
    reused = "persist CAcceptedRecord owner=1 index=1 ballot=1 batch=[c=3]"
    _, fixed = run_script(TESTDATA / "early_accept_crash_3.txt", InteractionEnv().handle)
    broken_env = InteractionEnv(unsafe=frozenset({"reuse_index"}))
    _, broken = run_script(TESTDATA / "early_accept_crash_3.txt", broken_env.handle)
    assert reused not in fixed
    assert reused in broken


def test_every_story_has_a_script() -> None:
    # the stories the scripts tell (issue 19, point 5; the golden scripts folded in and the
    # failure scripts of issue 35, point 5): a missing file would pass silently
    names = {p.stem for p in SCRIPTS}
    assert len(names) >= 22, sorted(names)


def test_the_runner_keeps_a_script_as_written_and_diffs_a_changed_output(
    tmp_path: Path,
) -> None:
    script = (
        "# a comment\n"
        "echo a b\n"
        "input line\n"
        "----\n"
        "a b\n"
        "\n"
        "echo blank\n"
        "----\n"
        "----\n"
        "first\n"
        "\n"
        "second\n"
        "----\n"
        "----\n"
    )
    path = tmp_path / "echo.txt"
    path.write_text(script)

    def echo(block: Block) -> str:
        return "first\n\nsecond" if block.args == ["blank"] else " ".join(block.args)

    expected, actual = run_script(path, echo)
    assert actual == expected == script
    path.write_text(script.replace("a b\n\n", "a c\n\n"))
    expected, actual = run_script(path, echo)
    assert actual == script
    assert "-a c\n+a b\n" in diff(expected, actual, "echo.txt")


def test_a_bad_command_names_its_line(tmp_path: Path) -> None:
    path = tmp_path / "bad.txt"
    path.write_text("add-nodes 3\n----\nok\n\npropose 7 x=1\n----\nok\n")
    with pytest.raises(ScriptError, match=r"bad.txt:5: .*no replica 7"):
        run_script(path, InteractionEnv().handle)


def test_a_definite_failure_that_took_effect_fails_the_retry_script() -> None:
    # Teeth for client_retry_recovered.txt (issue 39): a core that reports the command of an
    # instance recovered without it as failed *definitely* (what every core did before) is
    # caught by the environment's check, at the replica that reports it.
    env = InteractionEnv(unsafe=frozenset({"definite_recovered"}))
    with pytest.raises(AssertionError, match=r"a definite failure took effect: x=1 executed "
                       r"at replica 1 in slot 1, then failed definitely at replica 2"):
        run_script(TESTDATA / "client_retry_recovered.txt", env.handle)
