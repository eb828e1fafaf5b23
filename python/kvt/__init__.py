# SPDX-License-Identifier: Apache-2.0
"""kvt: KV-cache transfer for disaggregated LLM serving.

``kvt.TransferEngine`` has the methods of Mooncake's
``mooncake.engine.TransferEngine`` (same names, argument order, defaults
and return codes), implemented by kvt's C engine; the ``mooncake`` package
shipped next to this one re-exports it, so code written for Mooncake runs
on kvt unchanged. See docs/python.md for the call-by-call mapping.
"""

from kvt._kvt import (
    AccessError,
    AuthError,
    BusyError,
    CanceledError,
    Error,
    InvalidArgumentError,
    NotFoundError,
    NotSupportedError,
    PeerError,
    ProtocolError,
    ResourceError,
    StateError,
    TransferTimeoutError,
    NOTIFY_MAX,
    Read,
    TransferEngine,
    TransferNotify,
    TransferOpcode,
    VERSION_MAJOR,
    VERSION_MINOR,
    VERSION_PATCH,
    Write,
    doctor_json,
    metrics_listen,
    metrics_port,
    status_str,
)

from kvt import _logbridge  # noqa: E402,F401  (kvt's C log -> logging)


def doctor(peer=None, metadata=None, host=None, transports=None,
           auth_token=None, mem=None, timeout=None, probe_bytes=None,
           peers=None, log=False):
    """Check this host (and a peer, and a metadata server) before the
    first transfer: what ``kvt doctor`` prints, as a dict ``{"ok": bool,
    "worst": "ok"|"warn"|"fail", "checks": [{"id", "level", "status",
    "detail", "fix", "ms", "mbps", "lat_us"}, ...]}`` (docs/doctor.md).

    peer: a segment name ("host:port"), or its key in ``metadata``;
    host: the address an engine here would advertise; transports:
    "tcp,shm,ucx"; mem: "host,cuda"; timeout: seconds per network step;
    probe_bytes: bytes moved per transport for bandwidth (0: none).
    With ``log=True`` each check is also logged to the "kvt.doctor"
    logger (ok at INFO, warnings at WARNING, failures at ERROR, with the
    fix). Blocks for at most a few timeouts."""
    import json
    import logging

    report = json.loads(doctor_json(peer, metadata, host, transports,
                                    auth_token, mem, timeout, probe_bytes,
                                    peers))
    if log:
        logger = logging.getLogger("kvt.doctor")
        levels = {"ok": logging.INFO, "skip": logging.INFO,
                  "warn": logging.WARNING, "fail": logging.ERROR}
        for c in report["checks"]:
            msg = "%s %s: %s" % (c["level"], c["id"], c["detail"])
            if c["fix"] and c["level"] in ("warn", "fail"):
                msg += " (fix: %s)" % c["fix"]
            logger.log(levels[c["level"]], msg)
    return report


__version__ = f"{VERSION_MAJOR}.{VERSION_MINOR}.{VERSION_PATCH}"

__all__ = [
    "AccessError",
    "AuthError",
    "BusyError",
    "CanceledError",
    "Error",
    "InvalidArgumentError",
    "NotFoundError",
    "NotSupportedError",
    "PeerError",
    "ProtocolError",
    "ResourceError",
    "StateError",
    "TransferTimeoutError",
    "NOTIFY_MAX",
    "Read",
    "TransferEngine",
    "TransferNotify",
    "TransferOpcode",
    "Write",
    "doctor",
    "doctor_json",
    "metrics_listen",
    "metrics_port",
    "status_str",
]
