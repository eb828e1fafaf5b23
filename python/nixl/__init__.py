# SPDX-License-Identifier: Apache-2.0
"""NIXL's Python API served by kvt: ``nixl._api``, ``nixl._bindings`` and
``nixl.logging`` are kvt's (``kvt.nixl``). Installed only on request
(``KVT_NIXL_SHIM=1 pip install .``); see docs/nixl.md."""

from nixl import _api, _bindings, logging  # noqa: F401
from nixl._api import *  # noqa: F401,F403
