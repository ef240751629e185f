"""Impossible parameters of the allocation and watch benches and demo are usage errors: exit
status 2 and one line saying what is wrong, checked before anything starts (issue 27 point 7)."""

import pytest

from bench import alloc_bench
from bench.cli import main


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["bench", "alloc-e2e", "--nodes", "12500"], "multiple of 8"),
        (["bench", "alloc-e2e", "--nodes", "0"], "multiple of 8"),
        (["bench", "alloc-e2e", "--outstanding", "300"], "1..255"),
        (["bench", "alloc-e2e", "--seconds", "0"], "--seconds"),
        (["bench", "alloc-e2e", "--nodes", "16", "--vcs", "17"], "--vcs"),
        (["bench", "alloc-e2e", "--watchers", "3", "--slow-watchers", "4"], "--slow-watchers"),
        (["bench", "alloc-e2e", "--schedulers", "-1"], "--schedulers"),
        (["demo", "--duration", "0"], "--duration"),
        (["bench", "watch", "--watchers", "3", "--slow-watchers", "3"], "--slow-watchers"),
        (["bench", "watch", "--watchers", "3", "--processes", "4"], "--processes"),
        (["bench", "watch", "--rate", "0"], "--rate"),
        (["bench", "watch", "--max-in-flight", "0"], "--max-in-flight"),
        (["bench", "watch", "--nodes", "12"], "multiple of 8"),
        (["bench", "watch", "--source", "/nonexistent"], "not a checkout"),
    ],
)
def test_impossible_parameters_are_one_line_usage_errors(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    assert main(argv) == 2
    captured = capsys.readouterr()
    lines = captured.err.strip().splitlines()
    assert len(lines) == 1 and "error:" in lines[0] and fragment in lines[0]
    assert "Traceback" not in captured.err + captured.out


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--nodes", "12500"], "do not fill racks of 8"),
        (["--fill", "1.5"], "--fill"),
        (["--nodes", "8", "--vcs", "9"], "cannot be shared"),
        (["--ops", "0"], "--ops"),
        (["--in-flight", "-1"], "--in-flight"),
    ],
)
def test_alloc_bench_refuses_impossible_clusters(
    argv: list[str], fragment: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit) as exited:
        alloc_bench.main(argv)
    assert exited.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and fragment in err[0]
