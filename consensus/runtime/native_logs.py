"""What native libraries write on stderr, as the JSON log records every other line is.

A replica's log is one JSON object per line (``consensus.runtime.logs``), but gRPC's C core
writes its own lines to file descriptor 2 (``I1128 19:52:01.518153 2502
ssl_transport_security.cc:2563] Handshake failed ...``), which a log collector then cannot
parse. ``capture_native_stderr`` makes descriptor 2 a pipe and logs each line read from it
through the logging package (logger ``grpc`` for lines in the C core's format, at the level
their first letter says; ``stderr`` for anything else, as a warning), while Python's own
``sys.stderr``, and the log handlers that wrote to it, keep writing where descriptor 2 went
before.
"""

from __future__ import annotations

import io
import logging
import os
import re
import sys
import threading
from typing import Final

__all__ = ["NATIVE_LOGGER", "capture_native_stderr", "log_native_line"]

#: the logger of gRPC C core's lines, and of any other line on descriptor 2
NATIVE_LOGGER: Final = "grpc"
OTHER_LOGGER: Final = "stderr"
#: absl's format, which the C core uses: level letter, date, time, thread, source] message
_LINE: Final = re.compile(r"([IWEF])\d{4} [\d:.]+\s+\d+ ([^\]\s]+)\] ?(.*)")
_LEVELS: Final = {"I": logging.INFO, "W": logging.WARNING, "E": logging.ERROR,
                  "F": logging.CRITICAL}


def log_native_line(line: str) -> None:
    """Log one line a native library wrote on stderr."""
    match = _LINE.fullmatch(line)
    if match is None:
        logging.getLogger(OTHER_LOGGER).warning("%s", line)
        return
    letter, source, message = match.groups()
    logging.getLogger(NATIVE_LOGGER).log(_LEVELS[letter], "%s (%s)", message, source)


def capture_native_stderr() -> threading.Thread:
    """Route descriptor 2 through ``log_native_line`` (see the module); the reading thread
    (a daemon: it ends with the process)."""
    original = os.dup(2)
    read_end, write_end = os.pipe()
    os.dup2(write_end, 2)
    os.close(write_end)
    old = sys.stderr
    sys.stderr = io.TextIOWrapper(os.fdopen(original, "wb", buffering=0), line_buffering=True,
                                  errors="backslashreplace")
    for handler in logging.getLogger().handlers:  # the JSON handler, say: still where it was
        if isinstance(handler, logging.StreamHandler) and handler.stream is old:
            handler.setStream(sys.stderr)

    def pump() -> None:
        with os.fdopen(read_end, "rb") as lines:
            for raw in lines:
                text = raw.decode(errors="replace").rstrip("\n")
                if text:
                    log_native_line(text)

    thread = threading.Thread(target=pump, name="native-stderr", daemon=True)
    thread.start()
    return thread
