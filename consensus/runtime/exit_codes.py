"""The exit codes of every client verb: ``sdpaxos endpoint|get|put|del|cas|watch|snapshot save``
and ``sdpaxos ctl``. They are part of the command line's API (scripts branch on them).

====  ===========  ==================================================================
code  name         meaning
====  ===========  ==================================================================
0     OK           done as asked
1     REFUSED      a definite refusal: waiting, conflict, not found, denied (a TLS
                   cluster refused the client's certificate or its role:
                   ``TlsRefused``, ``PermissionDenied``), an invalid request, or a
                   watch that did not see its ``--count`` events within ``--wait``
2     USAGE        bad usage: an unknown or malformed option, an unreadable cluster
                   file, no endpoint given
3     UNAVAILABLE  no answer: no endpoint reachable, timed out, or (``endpoint``) an
                   endpoint unreachable or unhealthy
====  ===========  ==================================================================
"""

from __future__ import annotations

from typing import Final

__all__ = ["INTERRUPTED", "OK", "REFUSED", "UNAVAILABLE", "USAGE"]

OK: Final = 0
REFUSED: Final = 1
#: argparse exits with this code on a usage error, so the parser's own errors agree
USAGE: Final = 2
UNAVAILABLE: Final = 3
#: a command line interrupted by Ctrl-C (128 + SIGINT)
INTERRUPTED: Final = 130
