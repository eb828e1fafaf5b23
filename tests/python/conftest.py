# SPDX-License-Identifier: Apache-2.0
"""Shared fixtures: a target process (peer.py) and an initiator engine.

The initiator is this pytest process. Its transfer timeout is set small
(MC_TRANSFER_TIMEOUT, seconds, read by kvt when an engine is created) so
that the failure tests can check that a dead or stopped peer fails a
transfer within it.
"""

import base64
import ctypes
import json
import mmap
import os
import pathlib
import random
import select
import signal
import subprocess
import sys
import time

import pytest

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent.parent

# Default to the build tree when run by hand without PYTHONPATH.
try:
    import kvt  # noqa: F401
except ImportError:
    sys.path.insert(0, str(REPO / "build" / "python"))
    os.environ["PYTHONPATH"] = os.pathsep.join(
        p for p in (str(REPO / "build" / "python"),
                    os.environ.get("PYTHONPATH")) if p)
    import kvt  # noqa: F401

TIMEOUT_S = 2.0
os.environ["MC_TRANSFER_TIMEOUT"] = str(int(TIMEOUT_S))
os.environ.pop("KVT_TRANSFER_TIMEOUT", None)

MiB = 1 << 20


def address_of(buf):
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


class Peer:
    """A peer.py process; call() sends one command and returns the reply."""

    def __init__(self, metadata="P2PHANDSHAKE", protocol="tcp"):
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "peer.py"), "--host=127.0.0.1",
             f"--metadata={metadata}", f"--protocol={protocol}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
            env=os.environ.copy())
        self.stopped = False
        self.info = self._reply(30.0)
        assert "error" not in self.info, self.info
        assert self.info["rcs"] == [0, 0, 0], self.info
        self.segment = self.info["segment"]
        self.pid = self.proc.pid

    def _reply(self, timeout):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            raise TimeoutError("peer did not answer")
        line = self.proc.stdout.readline()
        if not line:
            raise RuntimeError(f"peer exited ({self.proc.poll()})")
        return json.loads(line)

    def call(self, timeout=30.0, **cmd):
        self.proc.stdin.write(json.dumps(cmd) + "\n")
        self.proc.stdin.flush()
        return self._reply(timeout)

    def read(self, addr, length):
        out = self.call(cmd="read", addr=addr, len=length)
        return base64.b64decode(out["data"])

    def fill(self, addr, data):
        out = self.call(cmd="fill", addr=addr,
                        data=base64.b64encode(data).decode())
        assert out["rc"] == 0

    def stop(self):
        """SIGSTOP, and wait until every thread is stopped: delivery is
        asynchronous, and a worker thread still running could serve one
        more request."""
        os.kill(self.pid, signal.SIGSTOP)
        self.stopped = True
        deadline = time.monotonic() + 10
        while not all(state == "T" for state in self._thread_states()):
            assert time.monotonic() < deadline, "peer did not stop"
            time.sleep(0.005)

    def _thread_states(self):
        states = []
        for tid in os.listdir(f"/proc/{self.pid}/task"):
            try:
                with open(f"/proc/{self.pid}/task/{tid}/stat") as f:
                    # The state follows the parenthesised command name.
                    states.append(f.read().rsplit(")", 1)[1].split()[0])
            except FileNotFoundError:
                pass
        return states

    def kill(self):
        os.kill(self.pid, signal.SIGKILL)
        self.proc.wait(10)

    def close(self):
        if self.proc.poll() is None:
            if self.stopped:
                os.kill(self.pid, signal.SIGCONT)
            self.proc.kill()
            self.proc.wait(10)
        self.proc.stdin.close()
        self.proc.stdout.close()


class Local:
    """Initiator-side memory: one registered anonymous mapping."""

    def __init__(self, engine, size):
        self.map = mmap.mmap(-1, size)
        self.addr = address_of(self.map)
        self.size = size
        assert engine.register_memory(self.addr, size) == 0

    def put(self, off, data):
        self.map[off:off + len(data)] = data

    def get(self, off, length):
        return bytes(self.map[off:off + length])


def new_engine(metadata="P2PHANDSHAKE", protocol="tcp"):
    from mooncake.engine import TransferEngine
    engine = TransferEngine()
    assert engine.initialize("127.0.0.1", metadata, protocol, "") == 0
    return engine


@pytest.fixture
def peer():
    p = Peer()
    yield p
    p.close()


@pytest.fixture(scope="module")
def shared_peer():
    p = Peer()
    yield p
    p.close()


@pytest.fixture
def engine():
    return new_engine()


@pytest.fixture(scope="module")
def shared_engine():
    return new_engine()


@pytest.fixture(scope="module")
def local(shared_engine):
    return Local(shared_engine, 16 * MiB)


def pattern(n, seed):
    """n reproducible pseudo-random bytes, different for each seed."""
    return random.Random(seed).randbytes(n)


class Elapsed:
    """Context manager measuring wall time, for the timeout checks."""

    def __enter__(self):
        self.t0 = time.monotonic()
        return self

    def __exit__(self, *exc):
        self.s = time.monotonic() - self.t0
