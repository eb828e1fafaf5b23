# SPDX-License-Identifier: Apache-2.0
"""Fixtures for the NIXL conformance suite: agents in this process, peer
agents in other processes (nixl_peer.py), free loopback ports and a
private etcd.

The suite tests whichever ``nixl`` package Python imports, the real
wheel or kvt's drop-in; nothing here depends on which one it is.

Every agent is made without a progress thread: NIXL's spins a core, and
this machine has two. Progress is made by the calls that poll
(check_xfer_state, get_new_notifs), so a test never blocks on a peer
while a send of its own agent is unfinished.
"""

import base64
import json
import logging
import os
import pathlib
import random
import select
import shutil
import socket
import subprocess
import sys
import time
import urllib.request
import uuid

import numpy as np
import pytest

# The wheel's UCX loads its InfiniBand module, whose bundled libnl-route
# crashes in an exit-time destructor (pytest would exit with SIGSEGV after
# every test passed). There is no InfiniBand here; a user may override.
os.environ.setdefault("UCX_MODULES", "^ib")

from nixl._api import nixl_agent, nixl_agent_config  # noqa: E402

HERE = pathlib.Path(__file__).resolve().parent
WAIT_S = 10.0  # bound on every wait for a peer, a transfer or metadata
POLL_S = 0.002
KiB = 1 << 10
MiB = 1 << 20
PEER_SIZE = 32 * MiB
IP = "127.0.0.1"


def pytest_report_header(config):
    import nixl
    return f"nixl package: {pathlib.Path(nixl.__file__).parent}"


def free_port():
    """A loopback TCP port that was free a moment ago."""
    with socket.socket() as s:
        s.bind((IP, 0))
        return s.getsockname()[1]


def unique(prefix):
    """An agent name no other test uses."""
    return f"{prefix}-{uuid.uuid4().hex[:8]}"


def pattern(n, seed):
    """n reproducible pseudo-random bytes, different for each seed."""
    return random.Random(seed).randbytes(n)


def b64(data):
    return base64.b64encode(data).decode()


def wait_for(predicate, what, timeout=WAIT_S):
    """Poll predicate until it returns a true value, and return that;
    fail naming what was awaited after timeout seconds."""
    deadline = time.monotonic() + timeout
    while True:
        value = predicate()
        if value:
            return value
        if time.monotonic() > deadline:
            pytest.fail(f"timed out after {timeout} s waiting for {what}")
        time.sleep(POLL_S)


def wait_xfer(agent, handle, timeout=WAIT_S, also=()):
    """Poll check_xfer_state until it is no longer "PROC"; return it.
    The Local agents in also are polled too: a target in this process
    has no progress thread to serve the transfer."""
    states = []

    def settled():
        for other in also:
            other.poll()
        states.append(agent.check_xfer_state(handle))
        return states[-1] != "PROC"

    wait_for(settled, "a transfer to leave PROC", timeout)
    return states[-1]


class Local:
    """An agent in this process whose buffer is registered as regions
    equal DRAM regions (rows: their (address, length, device) tuples;
    regs: their registration lists)."""

    def __init__(self, prefix="local", size=PEER_SIZE, regions=1, **config):
        self.name = unique(prefix)
        self.agent = nixl_agent(
            self.name, nixl_agent_config(enable_prog_thread=False, **config))
        self.buf = np.zeros(size, dtype=np.uint8)
        self.addr = self.buf.ctypes.data
        self.size = size
        part = size // regions
        self.rows = [(self.addr + i * part, part, 0) for i in range(regions)]
        self.regs = [self.agent.register_memory([row + ("local",)], "DRAM")
                     for row in self.rows]
        self.pending = {}  # agent name -> notifications not yet returned

    def descs(self, off, size):
        """One (address, length, device) tuple into the buffer."""
        return (self.addr + off, size, 0)

    def poll(self):
        """Make progress, keeping the notifications that came."""
        for name, msgs in self.agent.get_new_notifs().items():
            self.pending.setdefault(name, []).extend(msgs)

    def notifs(self, sender, count=1, timeout=WAIT_S):
        """Poll until count notifications from sender came; return them
        all."""
        wait_for(lambda: self.poll() or
                 len(self.pending.get(sender, [])) >= count,
                 f"{count} notification(s) from {sender}", timeout)
        return self.pending.pop(sender)

    def write(self, remote, remote_addr, off, size, notif=b"", also=()):
        """WRITE size bytes at off to remote_addr of agent remote; wait
        for "DONE", polling the Local agents in also meanwhile."""
        handle = self.agent.initialize_xfer(
            "WRITE",
            self.agent.get_xfer_descs([self.descs(off, size)], "DRAM"),
            self.agent.get_xfer_descs([(remote_addr, size, 0)], "DRAM"),
            remote, notif)
        assert self.agent.transfer(handle) in ("DONE", "PROC")
        assert wait_xfer(self.agent, handle, also=also) == "DONE"
        self.agent.release_xfer_handle(handle)


class PeerError(Exception):
    """A command failed in the peer; the message starts with the name of
    the exception it raised."""


class Peer:
    """A nixl_peer.py process. Its attributes come from its first line:
    name, addr (of its registered buffer), size, metadata (bytes)."""

    def __init__(self, prefix="peer", size=PEER_SIZE, listen_port=0,
                 env=None):
        self.proc = subprocess.Popen(
            [sys.executable, str(HERE / "nixl_peer.py"),
             f"--name={unique(prefix)}", f"--size={size}",
             f"--listen-port={listen_port}"],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            env=env if env is not None else os.environ.copy())
        self.unread = b""  # output read (with os.read) but not yet returned
        try:
            hello = self.reply(30.0)
        except BaseException:
            self.close()
            raise
        self.name = hello["name"]
        self.addr = hello["addr"]
        self.size = hello["size"]
        self.metadata = base64.b64decode(hello["metadata"])

    def send(self, cmd, **args):
        """Send one command without waiting for its answer."""
        self.proc.stdin.write(json.dumps({"cmd": cmd, **args}).encode()
                              + b"\n")
        self.proc.stdin.flush()

    def reply(self, timeout=WAIT_S + 5):
        """The answer to the oldest unanswered command."""
        deadline = time.monotonic() + timeout
        while b"\n" not in self.unread:
            left = deadline - time.monotonic()
            if left <= 0 or not select.select([self.proc.stdout], [], [],
                                              left)[0]:
                raise TimeoutError(f"peer gave no answer in {timeout} s")
            chunk = os.read(self.proc.stdout.fileno(), 1 << 20)
            if not chunk:
                raise RuntimeError(f"peer exited with {self.proc.poll()}")
            self.unread += chunk
        line, self.unread = self.unread.split(b"\n", 1)
        out = json.loads(line)
        if "error" in out:
            raise PeerError(out["error"])
        return out

    def call(self, cmd, **args):
        self.send(cmd, **args)
        return self.reply()

    def read(self, off, size):
        return base64.b64decode(self.call("read", off=off, size=size)["data"])

    def fill(self, off, data):
        self.call("fill", off=off, data=b64(data))

    def knows(self, name, descs=None):
        """check_remote_metadata(name[, descs]) in the peer."""
        return self.call("known", name=name, descs=descs)["known"]

    def notifs(self, sender, count=1, timeout=WAIT_S):
        """The notifications from sender, once at least count came."""
        out = self.call("notifs", count=count, timeout=timeout)["notifs"]
        return [base64.b64decode(m) for m in out.get(sender, [])]

    def send_notif(self, local, msg):
        """The peer sends msg to the Local agent local; its arrival is left
        to the caller."""
        self.call("send_notif", agent=local.name, msg=b64(msg))

    def kill(self):
        self.proc.kill()
        self.proc.wait(WAIT_S)

    def close(self):
        if self.proc.poll() is None:
            self.kill()
        self.proc.stdin.close()
        self.proc.stdout.close()


def connect(local, peer):
    """Load each other's metadata and open both directions: without a
    progress thread a first send_notif stays queued until the sender is
    polled, so a one-byte WRITE (polled to DONE) and a notification from
    the peer (polled for) establish the connections."""
    local.agent.add_remote_agent(peer.metadata)
    peer.call("add_remote", metadata=b64(local.agent.get_agent_metadata()))
    local.write(peer.name, peer.addr, 0, 1)
    peer.send_notif(local, b"connected")
    assert local.notifs(peer.name) == [b"connected"]


def disconnect(local, peer):
    local.agent.remove_remote_agent(peer.name)
    peer.close()


@pytest.fixture(scope="module")
def local():
    """The module's agent, with telemetry on."""
    return Local(capture_telemetry=True)


@pytest.fixture(scope="module")
def peer(local):
    """A peer process connected to the module's agent."""
    p = Peer()
    connect(local, p)
    yield p
    disconnect(local, p)


@pytest.fixture
def peers():
    """A factory of extra peer processes, all killed at teardown."""
    made = []

    def make(**kwargs):
        made.append(Peer(**kwargs))
        return made[-1]

    yield make
    for p in made:
        p.close()


@pytest.fixture(scope="module")
def etcd(tmp_path_factory):
    """A private single-node etcd on free loopback ports; its client URL."""
    binary = shutil.which("etcd") or "/usr/bin/etcd"
    if not os.access(binary, os.X_OK):
        pytest.skip("no etcd binary")
    client, peer_port = free_port(), free_port()
    url = f"http://{IP}:{client}"
    work = tmp_path_factory.mktemp("etcd")
    with open(work / "log", "w") as log:
        proc = subprocess.Popen(
            [binary, "--name=nixl-test", f"--data-dir={work / 'data'}",
             f"--listen-client-urls={url}", f"--advertise-client-urls={url}",
             f"--listen-peer-urls=http://{IP}:{peer_port}",
             f"--initial-advertise-peer-urls=http://{IP}:{peer_port}",
             f"--initial-cluster=nixl-test=http://{IP}:{peer_port}"],
            stdout=log, stderr=subprocess.STDOUT)

    def healthy():
        assert proc.poll() is None, (work / "log").read_text()
        try:
            with urllib.request.urlopen(url + "/health", timeout=1) as r:
                return json.load(r).get("health") == "true"
        except OSError:
            return False

    try:
        wait_for(healthy, "etcd to be healthy")
        yield url
    finally:
        proc.kill()
        proc.wait(WAIT_S)


class NixlLogRecords(logging.Handler):
    """Records logged under the "nixl" logger while installed."""

    def __init__(self):
        super().__init__(logging.DEBUG)
        self.records = []

    def emit(self, record):
        self.records.append(record)


@pytest.fixture
def nixl_log():
    handler = NixlLogRecords()
    logger = logging.getLogger("nixl")
    logger.addHandler(handler)
    yield handler.records
    logger.removeHandler(handler)
