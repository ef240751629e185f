"""The logs of the long-running verbs (``sdpaxos serve``, ``cluster up``'s replicas,
``extender``): one JSON object per line on stderr, for a collector to parse.

Each line holds ``ts`` (ISO-8601, UTC, microseconds: ``2026-11-26T01:53:00.123456+00:00``),
``level``, ``logger`` and ``msg``; a record logged with an exception (``log.exception``) also
holds ``exc``, the whole traceback as one string, and one with ``stack_info`` holds
``stack``: a traceback never spills over several lines of its own, so a collector never
mistakes its lines for other records. ``--log-level`` chooses the least severe level shown.

What the network can make happen again and again (a bad frame, a refused connection) is
logged through a ``RateLimited``: one line of a kind per ``LOG_INTERVAL_S``, the next one
saying how many were left out meanwhile (a peer sending bad frames wrote 4,503 lines, 852 KB,
in 20 s before).
"""

from __future__ import annotations

import argparse
import asyncio
import json
import logging
import math
import sys
import time
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Final, TextIO

__all__ = ["DEFAULT_LEVEL", "LOG_INTERVAL_S", "LOG_LEVELS", "JsonFormatter", "RateLimited",
           "add_log_level_argument", "configure_logging"]

#: a ``RateLimited`` kind of line is logged at most once per this many seconds
LOG_INTERVAL_S: Final = 10.0

#: the ``--log-level`` choices, least severe first
LOG_LEVELS: Final = ("debug", "info", "warning", "error", "critical")
DEFAULT_LEVEL: Final = "info"


class JsonFormatter(logging.Formatter):
    """One JSON object per log line: structured logs a collector can parse."""

    def format(self, record: logging.LogRecord) -> str:
        entry = {
            "ts": datetime.fromtimestamp(record.created, UTC).isoformat(timespec="microseconds"),
            "level": record.levelname.lower(),
            "logger": record.name,
            "msg": record.getMessage(),
        }
        if record.exc_info:
            entry["exc"] = self.formatException(record.exc_info)
        elif record.exc_text:
            entry["exc"] = record.exc_text
        if record.stack_info:
            entry["stack"] = self.formatStack(record.stack_info)
        # json.dumps escapes newlines: the traceback stays inside this one line
        return json.dumps(entry)


def add_log_level_argument(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--log-level", choices=LOG_LEVELS, default=DEFAULT_LEVEL, type=str.lower,
        help=f"the least severe log records shown (default: {DEFAULT_LEVEL}); logs are JSON "
        "lines on stderr",
    )  # fmt: skip


def configure_logging(level: str = DEFAULT_LEVEL, stream: TextIO | None = None) -> None:
    """Send every log record at ``level`` or above to ``stream`` (stderr) as JSON lines.
    A process whose root logger has handlers already (a program running a verb in-process,
    a test runner) keeps its own configuration: nothing changes."""
    if level not in LOG_LEVELS:
        raise ValueError(f"log level must be one of {', '.join(LOG_LEVELS)}, got {level!r}")
    if logging.getLogger().handlers:
        return
    handler = logging.StreamHandler(sys.stderr if stream is None else stream)
    handler.setFormatter(JsonFormatter())
    logging.basicConfig(level=level.upper(), handlers=[handler])


class RateLimited:
    """Warnings of one kind (a ``key``: what happened, and to whom if that matters) logged
    at most once per ``interval``: the first at once; those that follow within the interval
    are counted, and the next line logged says how many were left out (``"... (and 4502
    more like it since the last report)"``). Counts still unreported an interval after the
    last line get a line of their own (on the running event loop, if any), so a burst that
    stops is still told whole."""

    def __init__(self, logger: logging.Logger, interval: float | None = None, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        """``interval``: seconds (default ``LOG_INTERVAL_S``, read when this is made)."""
        self.logger = logger
        self.interval = LOG_INTERVAL_S if interval is None else interval
        self._clock = clock
        #: key -> (when it was last logged, lines left out since, the last one's words)
        self._kinds: dict[str, tuple[float, int, str]] = {}

    def warning(self, key: str, msg: str, *args: object) -> bool:
        """Log ``msg % args`` unless a ``key`` line was logged within the interval (then it
        is counted); True if it was logged."""
        now = self._clock()
        last, skipped, _ = self._kinds.get(key, (-math.inf, 0, ""))
        if now - last < self.interval:
            text = msg % args if args else msg
            self._kinds[key] = (last, skipped + 1, text)
            if not skipped:
                self._flush_later(key, last + self.interval - now)
            return False
        text = msg % args if args else msg
        if skipped:
            text += f" (and {skipped} more like it since the last report)"
        self.logger.warning("%s", text)
        self._kinds[key] = (now, 0, "")
        return True

    def flush(self, key: str) -> None:
        """Report what was left out of ``key``'s lines since its last one, if anything."""
        _, skipped, text = self._kinds.get(key, (-math.inf, 0, ""))
        if skipped:
            self.logger.warning("%s (the last of %d like it not logged since the last report)",
                                text, skipped)
            self._kinds[key] = (self._clock(), 0, "")

    def _flush_later(self, key: str, delay: float) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return  # no loop (tests drive it by hand): reported with the next line
        loop.call_later(max(0.0, delay), self.flush, key)
