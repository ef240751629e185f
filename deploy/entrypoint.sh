#!/bin/sh
# Runs an sdpaxos verb. For "serve" with SDPAXOS_NETEM=1 it first tries kernel-level WAN
# emulation (tc netem per peer; needs NET_ADMIN and a kernel with netem): when that works the
# transport's own delay emulation is turned off, otherwise the transport keeps emulating.
set -e
if [ "$1" = "serve" ] && [ "${SDPAXOS_NETEM:-0}" = "1" ]; then
    if sdpaxos cluster netem --config "$SDPAXOS_CONFIG" --id "$SDPAXOS_ID" --apply; then
        set -- "$@" --no-wan-emulation
    else
        echo "netem unavailable: the transport emulates WAN delays" >&2
    fi
fi
exec sdpaxos "$@"
