# SPDX-License-Identifier: Apache-2.0
"""``nixl.logging`` on kvt: the agent logs to the "nixl" logger."""

import logging as _logging


def get_logger(name="nixl"):
    """The logger NIXL callers ask for."""
    return _logging.getLogger(name)
