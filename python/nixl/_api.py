# SPDX-License-Identifier: Apache-2.0
"""``nixl._api`` on kvt: see kvt.nixl."""

from kvt.nixl._api import *  # noqa: F401,F403
from kvt.nixl._api import (  # noqa: F401
    DEFAULT_COMM_PORT,
    nixl_agent,
    nixl_agent_config,
    nixl_backend_handle,
    nixl_prepped_dlist_handle,
    nixl_thread_sync_t,
    nixl_xfer_handle,
)
