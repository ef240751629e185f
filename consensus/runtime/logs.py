"""The logs of the long-running verbs (``sdpaxos serve``, ``cluster up``'s replicas,
``extender``): one JSON object per line on stderr, for a collector to parse.

Each line holds ``ts`` (ISO-8601, UTC, microseconds: ``2026-11-26T01:53:00.123456+00:00``),
``level``, ``logger`` and ``msg``; a record logged with an exception (``log.exception``) also
holds ``exc``, the whole traceback as one string, and one with ``stack_info`` holds
``stack``: a traceback never spills over several lines of its own, so a collector never
mistakes its lines for other records. ``--log-level`` chooses the least severe level shown.
"""

from __future__ import annotations

import argparse
import json
import logging
import sys
from datetime import UTC, datetime
from typing import Final, TextIO

__all__ = ["DEFAULT_LEVEL", "LOG_LEVELS", "JsonFormatter", "add_log_level_argument",
           "configure_logging"]

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
