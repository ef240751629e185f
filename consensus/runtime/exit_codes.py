"""The exit codes of every client verb: ``sdpaxos endpoint|get|put|del|cas|watch|snapshot save``
and ``sdpaxos ctl``, and of ``sdpaxos serve``. They are part of the command line's API (scripts
and supervisors branch on them).

====  ===========  ==================================================================
code  name         meaning
====  ===========  ==================================================================
0     OK           done as asked
1     REFUSED      a definite refusal: waiting, conflict, not found, denied (a TLS
                   cluster's principal may not do this: ``PermissionDenied``), an
                   invalid request, or a watch that did not see its ``--count`` events
                   within ``--wait``
2     USAGE        bad usage: an unknown or malformed option, an unreadable cluster
                   file, no endpoint given
3     UNAVAILABLE  no answer: no endpoint reachable, timed out, or (``endpoint``) an
                   endpoint unreachable or unhealthy
5     TLS_REFUSED  the cluster refused this client at TLS, which no retry changes: it
                   requires TLS and the client spoke plaintext (or the other way
                   round), its certificate is not of the client's CA, or it does not
                   take the client's (another CA's, revoked, not a client's):
                   ``TlsRefused``; the message says which
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

__all__ = ["INTERRUPTED", "OK", "REFUSED", "REMOVED", "TLS_REFUSED", "UNAVAILABLE", "USAGE"]

OK: Final = 0
REFUSED: Final = 1
#: argparse exits with this code on a usage error, so the parser's own errors agree
USAGE: Final = 2
UNAVAILABLE: Final = 3
#: ``sdpaxos serve``: this replica was removed from its cluster (membership); do not restart it
REMOVED: Final = 4
#: a client verb: the cluster refused this client's TLS (``consensus.errors.TlsRefused``)
TLS_REFUSED: Final = 5
#: a command line interrupted by Ctrl-C (128 + SIGINT)
INTERRUPTED: Final = 130
