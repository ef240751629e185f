"""Golden interaction scripts for the SDPaxos core (``tests/protocol/golden/*.txt``).

A script is a list of input events, a line ``----``, then the expected trace. Blank lines and
``#`` comment lines are ignored in both parts; rewrite mode keeps everything above ``----``
and regenerates everything below it, so write explanations above it.

Events (one loop turn each: after an event every touched core's ``ready()`` is drained):

``config replicas=N [thrifty=1] [max_batch=K] [retransmit_us=T] [catchup_us=T]``
    must come first; builds N real cores (``random.Random(r)`` for replica r).
``discard Heartbeat LeaseGrant ...``
    messages of these types are thrown away when sent (never delivered, never traced).
``propose R client=C seq=S [client=C seq=S ...] [blind]``
    client commands at replica R, all in one turn (so they form one batch).
``deliver all``
    deliver in-flight messages, oldest first, until none is left (new ones included).
``deliver SRC->DST TYPE [first|last|together]`` (``*`` wildcards)
    deliver every matching message in flight now, oldest first, one turn each; or only the
    oldest / newest match; or, with ``together``, all of them in one turn per receiving
    replica (its inputs are batched).
``drop SRC->DST TYPE`` / ``dup SRC->DST TYPE``
    lose / duplicate every matching message in flight now.
``tick R at=T``
    move the clock to T (it never goes back) and run replica R's timers.
``xfail REASON``
    the expected trace is what the protocol *should* do and the core does not do it yet (a
    known bug): the test is a strict xfail, and rewrite mode leaves the script alone.

Trace lines (commands print as ``client:seq``, O-instance entries as ``slot=>owner``):

``== EVENT``                         a propose / ``deliver all`` / tick event, echoed
``R persist Record field=...``      a durable record in R's Ready
``R -> D Msg(...)``                  a message in ``send_after_persist`` (after the fsync)
``R ~> D Msg(...)``                  a message in ``send`` (needs no durability)
``D <- S Msg(...)``                  a delivery (input), ``drop``/``dup`` likewise
``R ready C:S``                      a command led at R became ready
``R exec slot=J off=K C:S led_here=B``  an ``Execution`` in R's Ready
``R failed C:S definite=B REASON``   a ``Failure`` in R's Ready

``GOLDEN_REWRITE=1 pytest tests/protocol/test_golden.py`` regenerates every expected part.
Review the diff by hand against the paper before keeping it: a golden file claims the trace
is right.
"""

from __future__ import annotations

import difflib
import os
from pathlib import Path

import pytest
from util import Net, cmd

from consensus import messages
from consensus.config import ProtocolConfig

GOLDEN = Path(__file__).parent / "golden"
SEPARATOR = "----"


def _kv(words: list[str]) -> dict[str, str]:
    return dict(w.split("=", 1) for w in words if "=" in w)


def _endpoints(spec: str) -> tuple[str, str]:
    src, dst = spec.split("->")
    return src, dst


def run_script(events: list[str]) -> list[str]:
    net: Net | None = None
    for number, line in enumerate(events, 1):
        words = line.split()
        op, args = words[0], words[1:]
        if op == "xfail":
            continue
        if op == "config":
            kv = _kv(args)
            settings: dict[str, object] = {
                k: (bool(int(v)) if k == "thrifty" else int(v)) for k, v in kv.items()
            }
            net = Net(ProtocolConfig(**settings))  # type: ignore[arg-type]
            continue
        assert net is not None, f"line {number}: 'config' must come first"
        if op == "discard":
            net.discard = net.discard + tuple(getattr(messages, name) for name in args)
        elif op == "propose":
            replica = int(args[0])
            blind = "blind" in args
            clients = [int(w.split("=")[1]) for w in args if w.startswith("client=")]
            seqs = [int(w.split("=")[1]) for w in args if w.startswith("seq=")]
            assert len(clients) == len(seqs), f"line {number}: client/seq pairs"
            net.log.append(f"== {line}")
            pairs = zip(clients, seqs, strict=True)
            net.propose(replica, *(cmd(c, s, blind=blind) for c, s in pairs))
        elif op == "deliver" and args == ["all"]:
            net.log.append(f"== {line}")
            net.deliver_all()
        elif op in ("deliver", "drop", "dup"):
            src, dst = _endpoints(args[0])
            chosen = net.matching(src, dst, args[1])
            assert chosen, f"line {number}: nothing in flight matches {line!r}"
            if op == "deliver" and "together" in args[2:]:
                net.deliver_together(chosen)
                continue
            if "first" in args[2:]:
                chosen = chosen[:1]
            elif "last" in args[2:]:
                chosen = chosen[-1:]
            for flight in chosen:
                {"deliver": net.deliver, "drop": net.drop, "dup": net.duplicate}[op](flight)
        elif op == "tick":
            net.log.append(f"== {line}")
            net.tick(int(args[0]), at=int(_kv(args[1:])["at"]))
        else:
            raise AssertionError(f"line {number}: unknown event {line!r}")
    assert net is not None
    return net.log


def _split(text: str) -> tuple[list[str], list[str], str]:
    head, sep, tail = text.partition(f"\n{SEPARATOR}\n")
    assert sep, "a golden script needs a '----' line"
    events = [
        line.strip()
        for line in head.splitlines()
        if line.strip() and not line.strip().startswith("#")
    ]
    expected = [
        line.rstrip()
        for line in tail.splitlines()
        if line.strip() and not line.startswith("#")
    ]
    return events, expected, head


SCRIPTS = sorted(GOLDEN.glob("*.txt"))


def _xfail_reason(path: Path) -> str | None:
    events, _, _ = _split(path.read_text())
    for line in events:
        if line.split()[0] == "xfail":
            return line.partition(" ")[2] or "known bug"
    return None


def _params() -> list[object]:
    params = []
    for path in SCRIPTS:
        reason = _xfail_reason(path)
        marks = [pytest.mark.xfail(strict=True, reason=reason)] if reason else []
        params.append(pytest.param(path, marks=marks, id=path.stem))
    return params


@pytest.mark.parametrize("path", _params())
def test_golden(path: Path) -> None:
    events, expected, head = _split(path.read_text())
    actual = run_script(events)
    if os.environ.get("GOLDEN_REWRITE") == "1" and _xfail_reason(path) is None:
        path.write_text(head + f"\n{SEPARATOR}\n" + "\n".join(actual) + "\n")
        return
    assert actual == expected, "\n".join(_diff(expected, actual))


def _diff(expected: list[str], actual: list[str]) -> list[str]:
    return list(difflib.unified_diff(expected, actual, "expected", "actual", lineterm=""))


def test_scripts_exist() -> None:
    names = {p.stem for p in SCRIPTS}
    assert len(names) >= 7, names
