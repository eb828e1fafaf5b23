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
    metrics_listen,
    metrics_port,
    status_str,
)

from kvt import _logbridge  # noqa: E402,F401  (kvt's C log -> logging)

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
    "metrics_listen",
    "metrics_port",
    "status_str",
]
