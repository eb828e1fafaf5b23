# SPDX-License-Identifier: Apache-2.0
"""NIXL's Python agent API on kvt (``kvt.nixl``).

``kvt.nixl.nixl_agent`` has the methods of NIXL's ``nixl._api.nixl_agent``;
the ``nixl`` compatibility package (installed with ``KVT_NIXL_SHIM=1``)
re-exports this one, so vLLM's NixlConnector and other NIXL callers run
on kvt unchanged. docs/nixl.md has the call-by-call mapping.
"""

from kvt.nixl._api import (  # noqa: F401
    DEFAULT_COMM_PORT,
    nixl_agent,
    nixl_agent_config,
    nixl_backend_handle,
    nixl_prepped_dlist_handle,
    nixl_thread_sync_t,
    nixl_xfer_handle,
)

__all__ = [
    "DEFAULT_COMM_PORT",
    "nixl_agent",
    "nixl_agent_config",
    "nixl_backend_handle",
    "nixl_prepped_dlist_handle",
    "nixl_thread_sync_t",
    "nixl_xfer_handle",
]
