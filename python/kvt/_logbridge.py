# SPDX-License-Identifier: Apache-2.0
"""kvt's C log lines, handed to Python's ``logging`` (logger ``"kvt"``).

The C library logs from its own threads; it queues each line without
touching Python, and the thread started here (``kvt-log``) passes the lines
to the logger, with the C file and line as the record's place. A call of
the binding that logs about a failure first passes on what is queued, on
its own thread: the cause, logged by the C library, comes before the
binding's line and before the call returns. Lines the
queue could not hold while Python was not draining are counted and
reported. ``KVT_PYTHON_LOGGING=0`` leaves kvt's lines on stderr, as the
C library writes them without a binding. ``KVT_LOG`` still decides which
lines the C library produces (default ``warn``).
"""

import atexit
import logging
import os
import threading

from kvt import _kvt

# kvt_log_level_t -> logging level; trace sits below DEBUG.
TRACE = 5
_LEVELS = {0: logging.ERROR, 1: logging.WARNING, 2: logging.INFO,
           3: logging.DEBUG, 4: TRACE}

_logger = logging.getLogger("kvt")
_lock = threading.Lock()
_thread = None


def _hand(lines):
    """Pass (level, file, line, msg) tuples to the logger "kvt"."""
    for level, file, line, msg in lines:
        lvl = _LEVELS.get(level, logging.ERROR)
        if not _logger.isEnabledFor(lvl):
            continue
        record = _logger.makeRecord(_logger.name, lvl, file, line, msg,
                                    None, None, func="kvt")
        _logger.handle(record)


def _pump():
    while True:
        # Woken by each line and by stop(); the timeout only bounds a
        # sleep nothing ends, so an idle process is not woken for nothing.
        lines = _kvt._log_next(60.0)
        if lines is None:
            return
        try:
            _hand(lines)
        finally:
            # A call failing meanwhile waits for this batch before it
            # passes on the lines after it (kvtpy_logbridge_flush()).
            _kvt._log_handed()


def start():
    """Route kvt's C log lines to the logger "kvt" (idempotent)."""
    global _thread
    with _lock:
        if _thread is not None and _thread.is_alive():
            return
        _kvt._log_capture(True)
        _thread = threading.Thread(target=_pump, name="kvt-log", daemon=True)
        _thread.start()


def stop(timeout=2.0):
    """Send kvt's lines to stderr again, after handing on what is queued."""
    global _thread
    with _lock:
        t, _thread = _thread, None
        _kvt._log_capture(False)
    if t is not None and t is not threading.current_thread():
        t.join(timeout)


def _after_fork_in_child():
    global _thread
    _thread = None
    start()


if os.environ.get("KVT_PYTHON_LOGGING", "1") not in ("0", "off", "no"):
    start()
    atexit.register(stop)
    os.register_at_fork(after_in_child=_after_fork_in_child)
