# SPDX-License-Identifier: Apache-2.0
"""What the serving frameworks rely on beyond the transfer calls: the
segment names vllm-ascend passes to initialize(), Mooncake's module flags,
and kvt's C log lines reaching Python's logging (logger "kvt")."""

import logging
import mmap
import os
import socket
import subprocess
import sys
import time

import pytest

import kvt
import mooncake.engine
from conftest import address_of

# Every flag Mooncake's mooncake.engine module defines.
MOONCAKE_FLAGS = ("SUPPORT_CUDA", "SUPPORT_EFA", "SUPPORT_HIP",
                  "SUPPORT_INTRA_NVLINK", "SUPPORT_MNNVL", "SUPPORT_MUSA")


def ipv6_loopback():
    try:
        with socket.socket(socket.AF_INET6) as s:
            s.bind(("::1", 0))
        return True
    except OSError:
        return False


@pytest.mark.parametrize("host", ["127.0.0.1",
                                  pytest.param("[::1]", marks=pytest.mark.skipif(
                                      not ipv6_loopback(),
                                      reason="no IPv6 loopback"))])
def test_ascend_segment_name(host):
    """vllm-ascend initializes with "HOST:0:npu_N" and its peers address
    the engine as "HOST:<get_rpc_port()>"; bytes written that way land."""
    target = kvt.TransferEngine()
    assert target.initialize(f"{host}:0:npu_3", "P2PHANDSHAKE", "ascend",
                             "") == 0
    port = target.get_rpc_port()
    assert port > 0
    dst = mmap.mmap(-1, 1 << 16)
    assert target.register_memory(address_of(dst), len(dst)) == 0

    init = kvt.TransferEngine()
    assert init.initialize(host, "P2PHANDSHAKE", "tcp", "") == 0
    src = mmap.mmap(-1, 1 << 16)
    src.write(os.urandom(len(src)))
    assert init.register_memory(address_of(src), len(src)) == 0
    assert init.transfer_sync_write(f"{host}:{port}", address_of(src),
                                    address_of(dst), len(src)) == 0
    assert dst[:] == src[:]


def test_bad_device_suffix_is_refused():
    """Only ":npu_<digits>" is taken as a device; anything else after the
    port is still a malformed local_hostname."""
    e = kvt.TransferEngine()
    assert e.initialize("127.0.0.1:0:gpu_1", "P2PHANDSHAKE", "tcp", "") == -1
    e = kvt.TransferEngine()
    assert e.initialize("127.0.0.1:0:npu_", "P2PHANDSHAKE", "tcp", "") == -1


def test_module_flags():
    for name in MOONCAKE_FLAGS:
        assert name in mooncake.engine.__all__
        assert isinstance(getattr(mooncake.engine, name), bool), name
    # kvt's true answers: CUDA memory when the domain is built, no other
    # device transport.
    assert mooncake.engine.SUPPORT_CUDA == bool(kvt._kvt.HAVE_CUDA)
    for name in MOONCAKE_FLAGS[1:]:
        assert getattr(mooncake.engine, name) is False, name


class Collect(logging.Handler):
    def __init__(self):
        super().__init__(level=1)
        self.records = []

    def emit(self, record):
        self.records.append(record)

    def wait_for(self, pred, timeout=5.0):
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            for r in list(self.records):
                if pred(r):
                    return r
            time.sleep(0.01)
        return None


@pytest.fixture
def collect():
    h = Collect()
    logger = logging.getLogger("kvt")
    old = logger.level
    logger.addHandler(h)
    logger.setLevel(1)
    yield h
    logger.removeHandler(h)
    logger.setLevel(old)


def test_c_log_lines_reach_logging(collect):
    kvt._kvt._log_emit(0, "a line from C")
    r = collect.wait_for(lambda r: r.getMessage() == "a line from C")
    assert r is not None
    assert r.levelno == logging.ERROR
    assert r.filename == "logbridge.c" and r.lineno > 0
    assert r.name == "kvt"


def test_engine_thread_lines_reach_logging(collect):
    """A line the engine logs on a thread of its own (publishing its
    descriptor to a metadata server nobody serves) reaches the logger."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        dead = s.getsockname()[1]
    e = kvt.TransferEngine()
    assert e.initialize("127.0.0.1", f"http://127.0.0.1:{dead}/metadata",
                        "tcp", "") == 0
    r = collect.wait_for(lambda r: r.filename.endswith(".c")
                         and "metadata" in r.getMessage()
                         and r.levelno >= logging.WARNING)
    assert r is not None, [x.getMessage() for x in collect.records]
    del e


def test_dropped_lines_are_counted():
    """With nobody draining, the queue keeps 1024 lines and reports how
    many it dropped."""
    from kvt import _logbridge
    _logbridge.stop()
    try:
        kvt._kvt._log_capture(True)
        for i in range(1100):
            kvt._kvt._log_emit(1, f"line {i}")
        got = []
        while True:
            batch = kvt._kvt._log_next(0.0)
            if not batch:
                break
            got.extend(batch)
        msgs = [m for _, _, _, m in got]
        assert msgs[:1024] == [f"line {i}" for i in range(1024)]
        assert len(msgs) == 1025
        assert msgs[1024].startswith("76 kvt log lines were dropped")
    finally:
        kvt._kvt._log_capture(False)
        assert kvt._kvt._log_next(0.0) is None
        _logbridge.start()


def run_py(code, **env):
    return subprocess.run([sys.executable, "-c", code], capture_output=True,
                          text=True, timeout=60,
                          env={**os.environ, **env})


def test_opt_out_keeps_stderr():
    code = ("import logging, kvt\n"
            "logging.basicConfig(level=logging.DEBUG)\n"
            "kvt._kvt._log_emit(1, 'to stderr')\n")
    out = run_py(code, KVT_PYTHON_LOGGING="0")
    assert out.returncode == 0, out.stderr
    assert "kvt WARN" in out.stderr and "to stderr" in out.stderr
    assert "WARNING:kvt" not in out.stderr
    out = run_py(code)
    assert out.returncode == 0, out.stderr
    assert "WARNING:kvt:to stderr" in out.stderr
    assert "kvt WARN" not in out.stderr


def test_forked_child_logs():
    code = ("import logging, os, sys, time, kvt\n"
            "logging.basicConfig(level=logging.DEBUG, stream=sys.stdout)\n"
            "pid = os.fork()\n"
            "if pid == 0:\n"
            "    kvt._kvt._log_emit(1, 'from the child')\n"
            "    time.sleep(0.5)\n"
            "    logging.shutdown(); os._exit(0)\n"
            "os.waitpid(pid, 0)\n")
    out = run_py(code)
    assert out.returncode == 0, out.stderr
    assert "WARNING:kvt:from the child" in out.stdout
