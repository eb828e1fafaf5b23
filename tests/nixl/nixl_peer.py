# SPDX-License-Identifier: Apache-2.0
"""Second-process NIXL agent for the conformance tests.

It creates one agent, registers one DRAM buffer, prints one JSON line
describing it (name, address, size, metadata), then answers one JSON
command per stdin line with one JSON line on stdout until stdin closes.
Binary values travel as base64. A command that raises answers
{"error": "<exception type>: <message>"}.

The commands let a test inspect and change the buffer from the outside,
drive the peer's side of a metadata exchange, collect the notifications
the peer receives, and make the peer initiate transfers of its own, so
every transfer is checked byte for byte in the process that owns the
memory.
"""

import argparse
import base64
import json
import os
import select
import time

# The protocol keeps the original stdout; everything else written to
# stdout (NIXL's log lines among it) goes to stderr.
PROTOCOL = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)

import numpy as np  # noqa: E402

from nixl._api import nixl_agent, nixl_agent_config  # noqa: E402

POLL_S = 0.002


def b64(data):
    return base64.b64encode(data).decode()


def unb64(text):
    return base64.b64decode(text)


class PeerAgent:
    """The agent, its buffer and the notifications received so far."""

    def __init__(self, args):
        config = nixl_agent_config(
            enable_prog_thread=False,
            enable_listen_thread=args.listen_port > 0,
            listen_port=args.listen_port)
        self.name = args.name
        self.agent = nixl_agent(args.name, config)
        self.buffer = np.zeros(args.size, dtype=np.uint8)
        self.addr = self.buffer.ctypes.data
        self.agent.register_memory(
            [(self.addr, args.size, 0, "peer")], "DRAM")
        self.pending = {}  # agent name -> notifications not yet returned
        self.handles = []  # transfers this peer initiated, by index

    def hello(self):
        return {"name": self.name, "addr": self.addr,
                "size": self.buffer.nbytes,
                "metadata": b64(self.agent.get_agent_metadata())}

    def poll(self):
        for name, msgs in self.agent.get_new_notifs().items():
            self.pending.setdefault(name, []).extend(msgs)

    def _take(self):
        out = {name: [b64(m) for m in msgs]
               for name, msgs in self.pending.items()}
        self.pending = {}
        return out

    def cmd_read(self, off, size):
        return {"data": b64(self.buffer[off:off + size].tobytes())}

    def cmd_fill(self, off, data):
        raw = unb64(data)
        self.buffer[off:off + len(raw)] = np.frombuffer(raw, dtype=np.uint8)
        return {}

    def cmd_memset(self, byte):
        self.buffer[:] = byte
        return {}

    def cmd_add_remote(self, metadata):
        self.agent.add_remote_agent(unb64(metadata))
        return {}

    def cmd_known(self, name, descs=None):
        """Whether metadata of agent name is loaded, for the DRAM
        descriptors (address, length, device) if given."""
        if descs is not None:
            descs = self.agent.get_xfer_descs(
                [tuple(d) for d in descs], "DRAM")
        return {"known": self.agent.check_remote_metadata(name, descs)}

    def cmd_send_metadata(self, ip="", port=None):
        if port is None:
            self.agent.send_local_metadata()
        else:
            self.agent.send_local_metadata(ip, port)
        return {}

    def cmd_fetch_metadata(self, name, ip="", port=None, label=""):
        if port is None:
            self.agent.fetch_remote_metadata(name, label=label)
        else:
            self.agent.fetch_remote_metadata(name, ip, port, label)
        return {}

    def cmd_invalidate(self, ip="", port=None):
        if port is None:
            self.agent.invalidate_local_metadata()
        else:
            self.agent.invalidate_local_metadata(ip, port)
        return {}

    def cmd_send_notif(self, agent, msg):
        self.agent.send_notif(agent, unb64(msg))
        return {}

    def cmd_xfer(self, op, remote, remote_addr, size, notif=""):
        """Initiate op between the start of this buffer and remote_addr
        of agent remote; answer the handle's index and transfer()'s
        state."""
        local = self.agent.get_xfer_descs([(self.addr, size, 0)], "DRAM")
        far = self.agent.get_xfer_descs([(remote_addr, size, 0)], "DRAM")
        handle = self.agent.initialize_xfer(op, local, far, remote,
                                            unb64(notif))
        self.handles.append(handle)
        return {"handle": len(self.handles) - 1,
                "state": self.agent.transfer(handle)}

    def cmd_repost(self, handle):
        return {"state": self.agent.transfer(self.handles[handle])}

    def cmd_wait(self, handle, timeout):
        """check_xfer_state until the transfer is no longer "PROC"."""
        deadline = time.monotonic() + timeout
        while True:
            state = self.agent.check_xfer_state(self.handles[handle])
            if state != "PROC" or time.monotonic() > deadline:
                return {"state": state}
            time.sleep(POLL_S)

    def cmd_notifs(self, count, timeout):
        """Notifications received, once at least count have arrived."""
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            if sum(map(len, self.pending.values())) >= count:
                return {"notifs": self._take()}
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"{count} notifications not received in {timeout} s, "
                    f"got {self._take()}")
            time.sleep(POLL_S)

    def cmd_fill_on_notif(self, tag, byte, timeout):
        """Wait for the notification tag, then at once overwrite the whole
        buffer with byte: a transfer still reading it would see the new
        contents."""
        wanted = unb64(tag)
        deadline = time.monotonic() + timeout
        while True:
            self.poll()
            if any(wanted in msgs for msgs in self.pending.values()):
                self.buffer[:] = byte
                return {"notifs": self._take()}
            if time.monotonic() > deadline:
                raise TimeoutError(f"notification {wanted!r} not received "
                                   f"in {timeout} s")
            time.sleep(POLL_S)


def serve(peer):
    """Answer commands until stdin closes. Between commands the agent is
    polled every POLL_S: it has no progress thread (one would spin a
    core), and a transport that needs the target's help (UCX over TCP)
    serves this buffer only while the agent is polled."""
    pending = b""
    while True:
        if not select.select([0], [], [], POLL_S)[0]:
            peer.poll()
            continue
        chunk = os.read(0, 1 << 20)
        if not chunk:
            return
        pending += chunk
        while b"\n" in pending:
            line, pending = pending.split(b"\n", 1)
            cmd = json.loads(line)
            try:
                out = getattr(peer, "cmd_" + cmd.pop("cmd"))(**cmd)
            except Exception as e:  # reported to the test, which decides
                out = {"error": f"{type(e).__name__}: {e}"}
            print(json.dumps(out), file=PROTOCOL, flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--name", required=True)
    ap.add_argument("--size", type=int, default=1 << 20)
    ap.add_argument("--listen-port", type=int, default=0)
    peer = PeerAgent(ap.parse_args())
    print(json.dumps(peer.hello()), file=PROTOCOL, flush=True)
    serve(peer)


if __name__ == "__main__":
    main()
