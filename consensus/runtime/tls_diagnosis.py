"""Why a client's connection to a replica fails at TLS, in words for the client.

A replica says exactly why it refuses a connection, in its own log (``consensus.runtime.tls``);
the client used to see only "connection to replica lost" or gRPC's "Socket closed", exit 3
("unavailable": retry). These are the client's side of it:

* ``refusal(exc, address)``: what a TLS error the client's own handshake or session raised
  means: the replica's certificate is not of the CA this client trusts (verification failed),
  or the replica refused this client's certificate (an alert: unknown CA, bad certificate,
  certificate required, revoked). None for errors that say nothing certain (a connection
  closed in the middle of a handshake may be a replica over its connection cap).
* ``diagnose(address, context)``: the same found by trying a connection, for clients that
  learn nothing from their own failure (gRPC's C core; a connection closed before any answer):
  a plaintext client's replica that completes a TLS handshake requires TLS; a TLS client's
  replica whose handshake fails on verification, that answers with an alert, or that closes
  the connection the moment the handshake is done (asyncio's TLS servers drop the alert)
  refuses it. None when TLS is not why: the replica waits for a request, or nothing answers.

The native client and ``sdpaxos ctl`` raise ``consensus.errors.TlsRefused`` with these
reasons: a definite refusal (exit 1), never "unavailable".
"""

from __future__ import annotations

import asyncio
import ssl
from typing import Final

__all__ = ["diagnose", "refusal", "requires_tls"]

#: seconds a diagnosis waits for a replica's handshake, and then for an alert
DIAGNOSIS_TIMEOUT_S: Final = 3.0
ALERT_WAIT_S: Final = 1.0
#: what a replica's TLS alert to a client says, by OpenSSL's reason
_ALERTS: Final = {
    "TLSV1_ALERT_UNKNOWN_CA": "it does not know the CA of this client's certificate (a "
    "certificate of another cluster's CA?)",
    "TLSV1_ALERT_DECRYPT_ERROR": "this client's certificate does not verify against the "
    "cluster's CA (a certificate of another CA of the same name?)",
    "SSLV3_ALERT_BAD_CERTIFICATE": "it refused this client's certificate",
    "SSLV3_ALERT_CERTIFICATE_UNKNOWN": "it refused this client's certificate",
    "SSLV3_ALERT_CERTIFICATE_REVOKED": "this client's certificate is revoked",
    "SSLV3_ALERT_CERTIFICATE_EXPIRED": "this client's certificate has expired",
    "TLSV13_ALERT_CERTIFICATE_REQUIRED": "it requires a client certificate of the cluster's CA "
    "and this client presented none",
    "TLSV1_ALERT_ACCESS_DENIED": "it denied this client's certificate",
}
#: OpenSSL's reasons when what came back is no TLS at all (a plaintext replica)
_NOT_TLS: Final = frozenset({"WRONG_VERSION_NUMBER", "UNKNOWN_PROTOCOL", "RECORD_LAYER_FAILURE",
                             "PACKET_LENGTH_TOO_LONG"})


def _where(address: tuple[str, int]) -> str:
    host, port = address
    return f"the replica at {f'[{host}]' if ':' in host else host}:{port}"


def refusal(exc: BaseException, address: tuple[str, int]) -> str | None:
    """What ``exc``, raised by this client's TLS handshake or session with ``address``, says
    for certain (None: nothing certain, e.g. a connection closed mid-handshake)."""
    where = _where(address)
    if isinstance(exc, ssl.SSLCertVerificationError):
        return (f"{where} presents a certificate this client does not trust "
                f"({exc.verify_message}): is the CA this client was given (the cluster file's "
                "[tls] ca, or --ca) the cluster's?")
    if not isinstance(exc, ssl.SSLError) or isinstance(exc, ssl.SSLEOFError):
        return None
    reason = exc.reason or ""
    if reason in _ALERTS:
        return f"{where} refused the TLS session: {_ALERTS[reason]} [{reason}]"
    if reason in _NOT_TLS:
        return f"{where} does not speak TLS (a cluster without [tls]?) [{reason}]"
    return None


async def requires_tls(address: tuple[str, int], timeout_s: float = DIAGNOSIS_TIMEOUT_S
                       ) -> bool:
    """Whether ``address`` completes a TLS handshake (no certificate checked on either side):
    what a plaintext client's lost connection means if it does."""
    probe = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    probe.check_hostname = False
    probe.verify_mode = ssl.CERT_NONE
    try:
        async with asyncio.timeout(timeout_s):
            _, writer = await asyncio.open_connection(*address, ssl=probe)
    except (OSError, TimeoutError):
        return False
    writer.close()
    return True


async def diagnose(address: tuple[str, int], context: ssl.SSLContext | None,
                   timeout_s: float = DIAGNOSIS_TIMEOUT_S) -> str | None:
    """Why connections with ``context`` (None: plaintext) to ``address`` fail at TLS, found
    by trying one (see the module); None when TLS is not why, or nothing answers."""
    if context is None:
        if await requires_tls(address, timeout_s):
            return (f"{_where(address)} requires TLS and this client spoke plaintext: give the "
                    "cluster file with its [tls] table (--config)")
        return None
    try:
        async with asyncio.timeout(timeout_s):
            reader, writer = await asyncio.open_connection(*address, ssl=context,
                                                           server_hostname=address[0])
    except ssl.SSLError as exc:
        return refusal(exc, address)
    except (OSError, TimeoutError):
        return None
    # TLS 1.3: a refused client certificate comes after the client's handshake completed: an
    # alert, or (asyncio's servers drop theirs) the connection closed before a word; a replica
    # that took the certificate waits for a request (or, gRPC, greets)
    try:
        async with asyncio.timeout(ALERT_WAIT_S):
            first = await reader.read(1)
    except ssl.SSLError as exc:
        return refusal(exc, address)
    except (OSError, TimeoutError):
        return None
    finally:
        writer.close()
    if first:
        return None
    return (f"{_where(address)} closes the connection as soon as the TLS handshake is done, "
            "without a word: it does not take this client's certificate (is it of the "
            "cluster's CA, and a client's?)")
