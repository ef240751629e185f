"""``sdpaxos ctl``'s exit codes (issue 21 point 2), the same as the ``sdpaxos`` client verbs'
(``consensus.runtime.exit_codes``): a submit left waiting is a refusal (1), not done; a watch
with ``--count`` ends at ``--wait``; no replica reachable is 3; no endpoint given is 2; the
cluster file and endpoints come from the environment too, options after the verb."""

from __future__ import annotations

import json
import time

import pytest

from bench.cli import main
from consensus.runtime.client_options import CONFIG_ENV, ENDPOINTS_ENV
from consensus.runtime.exit_codes import OK, REFUSED, UNAVAILABLE, USAGE
from consensus.runtime.local_cluster import free_base_port
from tests.cluster_state.test_grpc_ctl import server  # noqa: F401  (the fixture)

#: seconds a watch waits for events that never come
WATCH_WAIT_S = 1.0


def test_a_submit_left_waiting_exits_refused(
    server: str, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch  # noqa: F811
) -> None:
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    monkeypatch.setenv(ENDPOINTS_ENV, server)
    gang = ["--vc", "vc00", "--pods", "1x8"]
    codes = []
    for i in range(64):  # fill the VC: every later submit waits
        codes.append(main(["ctl", "submit", f"fill{i}", *gang, "--json"]))
        if codes[-1] != OK:
            break
    assert codes[0] == OK and codes[-1] == REFUSED, codes
    assert "waiting" in json.loads(capsys.readouterr().out.splitlines()[-1])


def test_a_watch_with_fewer_events_than_its_count_ends_at_wait(
    server: str, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    assert main(["ctl", "submit", "one", "--vc", "vc00", "--pods", "1x8", "--server",
                 server]) == OK
    capsys.readouterr()
    started = time.monotonic()
    assert main(["ctl", "watch", "--count", "1000", "--wait", str(WATCH_WAIT_S), "--json",
                 "--server", server]) == REFUSED
    assert time.monotonic() - started < WATCH_WAIT_S + 5
    out, err = capsys.readouterr()
    events = len(out.splitlines())
    assert events >= 1 and f"{events} of 1000 events" in err
    # without --count, the end of --wait is the end asked for
    assert main(["ctl", "--server", server, "watch", "--wait", str(WATCH_WAIT_S)]) == OK


def test_no_replica_reachable_is_unavailable_and_no_endpoint_is_usage(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv(ENDPOINTS_ENV, raising=False)
    monkeypatch.delenv(CONFIG_ENV, raising=False)
    assert main(["ctl", "summary"]) == USAGE
    assert "no endpoints" in capsys.readouterr().err
    dead = f"127.0.0.1:{free_base_port()}"
    assert main(["ctl", "summary", "--endpoints", dead, "--timeout", "2"]) == UNAVAILABLE
    assert "UNAVAILABLE" in capsys.readouterr().err


@pytest.mark.parametrize(("words", "fragment"), [
    (["submit", "j", "--vc", "vc00", "--pods", "1x1", "--priority", "99999999999999999999"],
     "--priority: 99999999999999999999 is not in -1..1000"),
    (["submit", "j", "--vc", "vc00", "--pods", "5000000000x1"],
     "5000000000 pods in '5000000000x1'; a group has at most 4096"),
    (["submit", "j", "--vc", "vc00", "--pods", "1x5000000000"], "is over 4294967295"),
    (["submit", "a" * 100_000, "--vc", "vc00", "--pods", "1x1"],
     "a name must be 1..256 characters, not 100000"),
    (["submit", "nul\x01job", "--vc", "vc00", "--pods", "1x1"],
     "must not hold control characters: U+0001 at 3"),
    (["bind", "j", "--vc", "vc00", "--pods", "1x1", "--on", "n:0-99999999999",
      "--revision", "1"], "names more than 4096 GPUs for one pod"),
    (["bind", "j", "--vc", "vc00", "--pods", "1x1", "--on", "n:0", "--revision",
      "99999999999999999999"], "--revision: 99999999999999999999 is not in"),
    (["watch", "--from", "x"], "--from: expected an integer, got 'x'"),
])
def test_bad_numbers_and_names_are_usage_errors_naming_the_limit(
    words: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    # issue 34: these printed Python tracebacks and exited 1 (the name: "must be a non-empty
    # string", its limit of 256 never named; a NUL in a name was placed)
    with pytest.raises(SystemExit) as exited:
        main(["ctl", "--endpoints", "127.0.0.1:1", *words])
    assert exited.value.code == USAGE
    err = capsys.readouterr().err
    assert fragment in err and "Traceback" not in err


def test_a_node_the_store_does_not_have_is_refused(
    server: str, capsys: pytest.CaptureFixture[str]  # noqa: F811
) -> None:
    # issue 34: "warning: unknown node", a table, and exit 0
    assert main(["ctl", "--server", server, "node", "nosuch", "--bad"]) == REFUSED
    captured = capsys.readouterr()
    assert "unknown node 'nosuch'" in captured.err and "nothing changed" in captured.err
    assert captured.out == ""
    assert main(["ctl", "--server", server, "--json", "node", "nosuch", "--bad"]) == REFUSED
    assert json.loads(capsys.readouterr().out)["changed"] is False


def test_names_with_control_characters_never_reach_the_log() -> None:
    from cluster_state import ops
    from cluster_state.errors import InvalidRequest

    for build in (lambda: ops.submit("a\x00b", "vc00", 1, [(1, 1)]),
                  lambda: ops.release("a\x00b"), lambda: ops.set_node_health("n\x7f", False),
                  lambda: ops.submit("j", "v\nc", 1, [(1, 1)])):
        with pytest.raises(InvalidRequest, match="control characters"):
            build()
    assert ops.decode_op(ops.submit("ok name", "vc00", 1, [(1, 1)]))  # a space is fine
