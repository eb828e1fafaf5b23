# SPDX-License-Identifier: Apache-2.0
"""kvt's own promises for its NIXL agent (kvt.nixl), beyond what the
black-box suite in tests/nixl checks against NIXL itself: refusals that
NIXL words otherwise (docs/nixl.md), notifications in fragments, no
notification after a failed READ, many threads on one agent, and the
arguments of TransferEngine._post()."""

import os
import threading
import time

import pytest

np = pytest.importorskip("numpy")

os.environ.setdefault("KVT_NIXL_HOST", "127.0.0.1")

import kvt  # noqa: E402
from kvt.nixl import _bindings as nb  # noqa: E402
from kvt.nixl import _meta  # noqa: E402
from kvt.nixl import nixl_agent, nixl_agent_config  # noqa: E402

KiB = 1024
_names = iter(range(1 << 30))


def agent(prefix="a", **kw):
    return nixl_agent(f"{prefix}-{os.getpid()}-{next(_names)}",
                      nixl_agent_config(**kw))


def pair(size=64 * KiB):
    """Two agents that know each other, each with a registered buffer."""
    a, b = agent("a"), agent("b")
    abuf = np.zeros(size, dtype=np.uint8)
    bbuf = np.zeros(size, dtype=np.uint8)
    a.register_memory([(abuf.ctypes.data, size, 0, "")], "DRAM")
    b.register_memory([(bbuf.ctypes.data, size, 0, "")], "DRAM")
    a.add_remote_agent(b.get_agent_metadata())
    b.add_remote_agent(a.get_agent_metadata())
    return a, abuf, b, bbuf


def wait_state(ag, h, timeout=10.0):
    deadline = time.monotonic() + timeout
    while True:
        st = ag.check_xfer_state(h)
        if st == "DONE":
            return st
        assert time.monotonic() < deadline, "transfer not done in time"
        time.sleep(0.001)


def collect(ag, name, count, timeout=10.0):
    got = []
    deadline = time.monotonic() + timeout
    while len(got) < count and time.monotonic() < deadline:
        got += ag.get_new_notifs().get(name, [])
        time.sleep(0.002)
    return got


@pytest.mark.parametrize("mem", ["FILE", "BLOCK", "OBJ"])
def test_storage_memory_types_are_not_supported(mem):
    a = agent()
    with pytest.raises(nb.nixlNotSupportedError):
        a.register_memory([(0x1000, 4096, 0, "")], mem)
    with pytest.raises(nb.nixlNotSupportedError):
        a.prep_xfer_dlist("", [(0x1000, 4096, 0)], mem)


def test_foreign_and_future_metadata_are_refused():
    a = agent()
    with pytest.raises(nb.nixlInvalidParamError, match="not kvt's"):
        a.add_remote_agent(b"\x00NIXL-binary-metadata")
    blob = bytearray(agent().get_agent_metadata())
    blob[len(_meta.MAGIC)] = _meta.VERSION + 1
    with pytest.raises(nb.nixlMismatchError, match="version"):
        a.add_remote_agent(bytes(blob))


def test_notifications_in_fragments_up_to_one_mib():
    a, _, b, _ = pair()
    msgs = [bytes(range(256)) * (n // 256) for n in (4 * KiB, 64 * KiB,
                                                     1 << 20)]
    for m in msgs:
        a.send_notif(b.name, m)
    assert collect(b, a.name, len(msgs)) == msgs
    with pytest.raises(nb.nixlInvalidParamError):
        a.send_notif(b.name, b"x" * ((1 << 20) + 1))


@pytest.mark.parametrize("op", ["READ", "WRITE"])
def test_no_notification_after_a_failed_transfer(op):
    """A transfer to a range the peer has since deregistered fails at the
    peer (kvt's access check), and the notification that would tell the
    peer its memory was read, or written, is never sent."""
    a, abuf, b, bbuf = pair()
    local = a.prep_xfer_dlist("", [(abuf.ctypes.data, KiB, 0)], "DRAM")
    far = a.prep_xfer_dlist(b.name, [(bbuf.ctypes.data, KiB, 0)], "DRAM")
    b.deregister_memory(b.get_reg_descs([(bbuf.ctypes.data, bbuf.nbytes, 0,
                                          "")], "DRAM"))
    h = a.make_prepped_xfer(op, local, [0], far, [0], b"done")
    deadline = time.monotonic() + 10
    # The refusal may come back before transfer() returns (a same-host
    # copy done at once), or while it is polled.
    with pytest.raises(nb.nixlNotFoundError):
        a.transfer(h)
        while a.check_xfer_state(h) == "PROC":
            assert time.monotonic() < deadline
            time.sleep(0.001)
    time.sleep(0.2)
    assert b.get_new_notifs() == {}


def test_many_threads_on_one_agent():
    """Four threads post WRITEs with notifications through one agent; every
    byte and every notification arrives."""
    threads, per = 4, 50
    a, abuf, b, bbuf = pair(size=threads * per * KiB)
    for i in range(abuf.size // KiB):
        abuf[i * KiB:(i + 1) * KiB] = i % 251
    errors = []

    def run(t):
        try:
            for k in range(per):
                off = (t * per + k) * KiB
                h = a.initialize_xfer(
                    "WRITE",
                    a.get_xfer_descs([(abuf.ctypes.data + off, KiB, 0)],
                                     "DRAM"),
                    a.get_xfer_descs([(bbuf.ctypes.data + off, KiB, 0)],
                                     "DRAM"),
                    b.name, b"w%d-%d" % (t, k))
                a.transfer(h)
                wait_state(a, h)
                a.release_xfer_handle(h)
        except Exception as e:  # noqa: BLE001 (reported below)
            errors.append(e)

    ts = [threading.Thread(target=run, args=(t,)) for t in range(threads)]
    for t in ts:
        t.start()
    for t in ts:
        t.join(60)
    assert not errors, errors
    got = collect(b, a.name, threads * per)
    assert sorted(got) == sorted(b"w%d-%d" % (t, k) for t in range(threads)
                                 for k in range(per))
    assert np.array_equal(abuf, bbuf)


def test_post_arguments():
    e = kvt.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    u = np.zeros(2, dtype=np.uint64)
    with pytest.raises(TypeError, match="64-bit"):
        e._post("127.0.0.1:1", 0, np.zeros(2, dtype=np.uint32), u, u)
    with pytest.raises(ValueError, match="differ in length"):
        e._post("127.0.0.1:1", 0, u, u, np.zeros(3, dtype=np.uint64))
    with pytest.raises(ValueError, match="READ or WRITE"):
        e._post("127.0.0.1:1", 2, u, u, u)
    with pytest.raises(ValueError, match="over"):
        e._post("127.0.0.1:1", 1, u, u, u, (b"x" * (kvt.NOTIFY_MAX + 1),))


def test_release_of_an_active_transfer_raises_and_keeps_the_handle():
    """kvt cannot recall bytes in flight: releasing an active transfer
    raises (as NIXL does when it cannot cancel) and the handle stays
    usable; once done it releases."""
    size = 64 << 20
    a, abuf, b, bbuf = pair(size=size)
    h = a.initialize_xfer(
        "WRITE", a.get_xfer_descs([(abuf.ctypes.data, size, 0)], "DRAM"),
        a.get_xfer_descs([(bbuf.ctypes.data, size, 0)], "DRAM"), b.name)
    raised = False
    for _ in range(20):
        if a.transfer(h) == "PROC":
            try:
                a.release_xfer_handle(h)
            except nb.nixlBackendError:
                raised = True
                break
        wait_state(a, h)
    if not raised:
        pytest.skip("every 64 MiB write finished inside transfer()")
    assert wait_state(a, h) == "DONE"
    a.release_xfer_handle(h)
    a.release_xfer_handle(h)


def test_adjacent_regions_are_not_merged_into_one_descriptor():
    """Two registrations side by side in memory: descriptors contiguous
    across their boundary stay two descriptors (kvt needs each inside one
    region), and the transfer succeeds."""
    a, b = agent("a"), agent("b")
    abuf = np.arange(8 * KiB, dtype=np.uint8)
    bbuf = np.zeros(8 * KiB, dtype=np.uint8)
    half = 4 * KiB
    for ag, buf in ((a, abuf), (b, bbuf)):
        ag.register_memory([(buf.ctypes.data, half, 0, ""),
                            (buf.ctypes.data + half, half, 0, "")], "DRAM")
    a.add_remote_agent(b.get_agent_metadata())
    rows = [(off, half) for off in (0, half)]
    local = a.prep_xfer_dlist("", [(abuf.ctypes.data + o, n, 0)
                                   for o, n in rows], "DRAM")
    far = a.prep_xfer_dlist(b.name, [(bbuf.ctypes.data + o, n, 0)
                                     for o, n in rows], "DRAM")
    h = a.make_prepped_xfer("WRITE", local, [0, 1], far, [0, 1])
    a.transfer(h)
    wait_state(a, h)
    assert np.array_equal(abuf, bbuf)


def test_listener_survives_hostile_requests():
    """Garbage, oversized and malformed metadata sent to an agent's
    listener are refused one by one; the listener still serves."""
    import socket
    import struct
    port = _free_port()
    b = agent("b", enable_listen_thread=True, listen_port=port)
    bad = [b"GET / HTTP/1.0\r\n\r\n",
           b"KVNLS" + struct.pack(">I", 1 << 30),
           b"KVNLS" + struct.pack(">I", 20) + _meta.MAGIC + b"\x01" + b"[" * 12,
           b"KVNLS" + struct.pack(">I", 0)]
    blob = _meta.MAGIC + bytes([_meta.VERSION]) + (
        b'{"name": "x", "segment": "h:1", "regions": [[1e400, 1, 0, 0]]}')
    bad.append(b"KVNLS" + struct.pack(">I", len(blob)) + blob)
    for req in bad:
        with socket.create_connection(("127.0.0.1", port), timeout=5) as s:
            s.sendall(req)
    a = agent("a")
    a.send_local_metadata("127.0.0.1", port)
    deadline = time.monotonic() + 10
    while not b.check_remote_metadata(a.name):
        assert time.monotonic() < deadline, "listener stopped serving"
        time.sleep(0.01)
    b.close()


def test_post_to_a_silent_peer_is_bounded():
    """_post() to a listener that never answers the handshake raises within
    the connect timeout, naming the cause."""
    import socket
    srv = socket.socket()
    srv.bind(("127.0.0.1", 0))
    srv.listen(1)
    e = kvt.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    u = np.zeros(1, dtype=np.uint64)
    t = time.monotonic()
    with pytest.raises(kvt.Error):
        # The silent listener never completes the handshake.
        e._post("127.0.0.1:%d" % srv.getsockname()[1], 0, u, u, u + 1)
    assert time.monotonic() - t < 30
    srv.close()


def test_post_wait_sleeps_until_final_or_timeout():
    """Post.wait(ms) on a transfer in flight returns when it is final or
    after about ms milliseconds, never at once while still pending; a
    release() from another thread waits for the waiter."""
    size = 256 << 20
    a, abuf, b, bbuf = pair(size=size)
    u = lambda *v: np.array(v, dtype=np.uint64)  # noqa: E731
    post = a._engine._post(b.get_segment_name(), 1, u(abuf.ctypes.data),
                           u(bbuf.ctypes.data), u(size))
    t = time.monotonic()
    st = post.wait(200)
    took = time.monotonic() - t
    assert st == 0 or (st == 1 and took >= 0.15), (st, took)
    # A waiter without the GIL while another thread releases the post: the
    # release waits for the waiter, which sees the final state (or, if
    # the release came first, that the post was released).
    seen = []

    def waiter():
        try:
            seen.append(post.wait(-1))
        except kvt.StateError as e:
            seen.append(str(e))

    th = threading.Thread(target=waiter)
    th.start()
    post.release()
    th.join(30)
    assert not th.is_alive()
    assert seen in ([0], ["the post was released"]), seen


def _free_port():
    import socket
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
