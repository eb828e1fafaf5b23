# SPDX-License-Identifier: Apache-2.0
"""``nixl._bindings`` on kvt: see kvt.nixl._bindings."""

from kvt.nixl._bindings import *  # noqa: F401,F403
