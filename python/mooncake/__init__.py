# SPDX-License-Identifier: Apache-2.0
"""Compatibility package: Mooncake's Python module names, served by kvt.

Only the transfer engine is provided (``mooncake.engine``); Mooncake Store
is not part of kvt.
"""
