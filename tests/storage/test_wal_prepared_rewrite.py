"""``prepare_rewrite`` (in another thread) + ``install_rewrite``: the same log as ``rewrite`` of
the prepared records and those logged meanwhile, and a crash before the install leaves the log
as it was."""

from __future__ import annotations

import threading
from pathlib import Path

from consensus.storage.wal import PreparedRewrite, WriteAheadLog


def records(prefix: str, count: int, size: int = 40) -> list[bytes]:
    return [f"{prefix}{i:06d}".encode().ljust(size, b".") for i in range(count)]


def prepared_in_a_thread(wal: WriteAheadLog, payloads: list[bytes]) -> PreparedRewrite:
    made: list[PreparedRewrite] = []
    worker = threading.Thread(target=lambda: made.append(wal.prepare_rewrite(payloads)))
    worker.start()
    worker.join()
    return made[0]


def logged(wal: WriteAheadLog, payloads: list[bytes]) -> None:
    for payload in payloads:
        wal.append(payload)
    wal.sync()


def test_the_installed_log_is_the_prepared_records_then_those_logged_meanwhile(
    tmp_path: Path,
) -> None:
    wal = WriteAheadLog(tmp_path)
    logged(wal, records("old", 500))
    prepared = prepared_in_a_thread(wal, records("kept", 20))
    logged(wal, records("meanwhile", 30))
    wal.install_rewrite(prepared, records("meanwhile", 30))
    logged(wal, records("after", 10))
    assert len(wal) == 60
    wal.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["wal-00000000000000000001.log"]
    again = WriteAheadLog(tmp_path)
    assert again.recovered == [*records("kept", 20), *records("meanwhile", 30),
                               *records("after", 10)]
    again.close()


def test_a_crash_before_the_install_leaves_the_log_as_it_was(tmp_path: Path) -> None:
    wal = WriteAheadLog(tmp_path)
    logged(wal, records("old", 50))
    prepared_in_a_thread(wal, records("kept", 5))
    logged(wal, records("meanwhile", 5))
    wal.close()  # the process dies here: the prepared segment was never installed
    again = WriteAheadLog(tmp_path)
    assert again.recovered == [*records("old", 50), *records("meanwhile", 5)]
    assert not list(tmp_path.glob("segment-*.tmp"))
    again.close()


def test_without_room_for_what_was_logged_meanwhile_it_is_a_plain_rewrite(
    tmp_path: Path,
) -> None:
    wal = WriteAheadLog(tmp_path)
    prepared = prepared_in_a_thread(wal, records("kept", 2))
    meanwhile = records("meanwhile", 40, size=prepared.capacity // 20)
    logged(wal, meanwhile)
    wal.install_rewrite(prepared, meanwhile)
    assert not prepared.path.exists()
    wal.close()
    again = WriteAheadLog(tmp_path)
    assert again.recovered == [*records("kept", 2), *meanwhile]
    again.close()
