# SPDX-License-Identifier: Apache-2.0
"""``nixl.logging`` on kvt: the agent logs to the "kvt.nixl" logger."""

import logging as _logging


def get_logger(name="nixl"):
    """The logger NIXL callers ask for; kvt's agent logs to kvt.nixl."""
    return _logging.getLogger(name)
