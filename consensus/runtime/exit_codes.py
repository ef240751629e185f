"""The exit codes of every client verb: ``sdpaxos endpoint|get|put|del|cas|watch|snapshot save``
and ``sdpaxos ctl``, and of ``sdpaxos serve``. They are part of the command line's API (scripts
and supervisors branch on them).

====  ===========  ==================================================================
code  name         meaning
====  ===========  ==================================================================
0     OK           done as asked
1     REFUSED      a definite refusal: waiting, conflict, not found, denied, or a
                   watch that did not see its ``--count`` events within ``--wait``
2     USAGE        bad usage: an unknown or malformed option, an unreadable cluster
                   file, no endpoint given
3     UNAVAILABLE  no answer: no endpoint reachable, timed out, or (``endpoint``) an
                   endpoint unreachable or unhealthy
====  ===========  ==================================================================

``sdpaxos serve`` (one replica's process): 0 stopped by a signal; 1 stopped by an error (a
peer refused its identity, its directory is in use); 2 bad configuration or data directory;
4 ``REMOVED``: a membership change removed this replica from the cluster (it logged so and
stopped), or its data directory is one of a removed member: it never serves again, so a
supervisor must not restart it (a replica there again is a new member: ``sdpaxos member
add``).
"""

from __future__ import annotations

from typing import Final

__all__ = ["INTERRUPTED", "OK", "REFUSED", "REMOVED", "UNAVAILABLE", "USAGE"]

OK: Final = 0
REFUSED: Final = 1
#: argparse exits with this code on a usage error, so the parser's own errors agree
USAGE: Final = 2
UNAVAILABLE: Final = 3
#: ``sdpaxos serve``: this replica was removed from its cluster (membership); do not restart it
REMOVED: Final = 4
#: a command line interrupted by Ctrl-C (128 + SIGINT)
INTERRUPTED: Final = 130
