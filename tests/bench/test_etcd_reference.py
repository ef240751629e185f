"""``bench.etcd_reference``: etcd is not a dependency: without its binary the bench says so
and exits 2, as it does for impossible arguments."""

from __future__ import annotations

import pytest

from bench import etcd_reference


def test_without_etcd_it_says_so(monkeypatch: pytest.MonkeyPatch,
                                 capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.setattr("bench.etcd_reference.shutil.which", lambda name: None)
    assert etcd_reference.main(["--writes", "5"]) == etcd_reference.USAGE_ERROR
    err = capsys.readouterr().err
    assert "no etcd binary" in err and "etcd-server" in err


def test_impossible_arguments_are_usage_errors() -> None:
    with pytest.raises(SystemExit) as exit_info:
        etcd_reference.main(["--writes", "0"])
    assert exit_info.value.code == 2
