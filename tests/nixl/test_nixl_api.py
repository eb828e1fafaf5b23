# SPDX-License-Identifier: Apache-2.0
"""Conformance tests for NIXL's Python agent API (nixl._api).

Written from the behaviour of the real NIXL wheel (1.5), so that kvt's
drop-in can be held to it. Data written to a peer is checked byte for
byte in the peer's process; data read from it is checked here.
README.md lists the behaviours found, one line each.
"""

import pickle
import socket
import time

import numpy as np
import pytest

from nixl import _bindings as nb
from nixl._api import nixl_agent, nixl_agent_config

from conftest import (IP, KiB, MiB, PEER_SIZE, WAIT_S, Local, PeerError,
                      b64, free_port, pattern, unique, wait_for, wait_xfer)


# --- agent creation and configuration ----------------------------------------

def test_empty_agent_name_raises_value_error():
    with pytest.raises(ValueError):
        nixl_agent("", nixl_agent_config(enable_prog_thread=False))


def test_unknown_backend_is_skipped_with_a_warning(nixl_log):
    agent = nixl_agent(unique("skip"), nixl_agent_config(
        enable_prog_thread=False, backends=["NO_SUCH_BACKEND", "UCX"]))
    assert any(r.levelname == "WARNING"
               and "NO_SUCH_BACKEND" in r.getMessage() for r in nixl_log)
    buf = np.zeros(4 * KiB, dtype=np.uint8)
    agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")


def test_agent_without_any_backend_cannot_register_memory():
    agent = nixl_agent(unique("none"), nixl_agent_config(
        enable_prog_thread=False, backends=["NO_SUCH_BACKEND"]))
    buf = np.zeros(4 * KiB, dtype=np.uint8)
    with pytest.raises(nb.nixlNotFoundError):
        agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")


def loopback_write(agent, name, buf):
    """WRITE the first half of buf onto its second half, the agent (called
    name) being its own remote; return the handle, polled to DONE."""
    half = buf.nbytes // 2
    handle = agent.initialize_xfer(
        "WRITE",
        agent.get_xfer_descs([(buf.ctypes.data, half, 0)], "DRAM"),
        agent.get_xfer_descs([(buf.ctypes.data + half, half, 0)], "DRAM"),
        name, b"")
    agent.transfer(handle)
    assert wait_xfer(agent, handle) == "DONE"
    return handle


def test_config_positional_arguments():
    """(enable_prog_thread, enable_listen_thread, listen_port,
    capture_telemetry): the listener takes connections on the port, and
    telemetry is captured."""
    port = free_port()
    name = unique("positional")
    agent = nixl_agent(name, nixl_agent_config(False, True, port, True))
    with socket.create_connection((IP, port), timeout=WAIT_S):
        pass
    buf = np.arange(8 * KiB, dtype=np.uint8)
    agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    handle = loopback_write(agent, name, buf)
    assert bytes(buf[4 * KiB:]) == bytes(buf[:4 * KiB])
    assert agent.get_xfer_telemetry(handle).totalBytes == 4 * KiB


def test_telemetry_off_by_default_raises_no_telemetry():
    name = unique("notel")
    agent = nixl_agent(name, nixl_agent_config(enable_prog_thread=False))
    buf = np.zeros(8 * KiB, dtype=np.uint8)
    agent.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    handle = loopback_write(agent, name, buf)
    with pytest.raises(nb.nixlNoTelemetryError):
        agent.get_xfer_telemetry(handle)


# --- metadata within one process ---------------------------------------------

def test_metadata_exchange_in_process():
    a, b = Local("a", size=64 * KiB), Local("b", size=64 * KiB)
    blob = b.agent.get_agent_metadata()
    assert isinstance(blob, bytes) and blob
    assert a.agent.check_remote_metadata(b.name) is False
    assert a.agent.add_remote_agent(blob) == b.name.encode()
    assert a.agent.check_remote_metadata(b.name) is True

    a.buf[:4 * KiB] = np.frombuffer(pattern(4 * KiB, 1), dtype=np.uint8)
    a.write(b.name, b.addr + 8 * KiB, 0, 4 * KiB, b"in-process", also=[b])
    assert bytes(b.buf[8 * KiB:12 * KiB]) == pattern(4 * KiB, 1)
    assert b.notifs(a.name) == [b"in-process"]

    a.agent.remove_remote_agent(b.name)
    assert a.agent.check_remote_metadata(b.name) is False
    with pytest.raises(nb.nixlNotFoundError):
        a.agent.prep_xfer_dlist(b.name, [b.descs(0, KiB)], "DRAM")
    assert a.agent.add_remote_agent(blob) == b.name.encode()
    assert a.agent.check_remote_metadata(b.name) is True


def test_loading_own_metadata_raises_invalid_param(local):
    with pytest.raises(nb.nixlInvalidParamError):
        local.agent.add_remote_agent(local.agent.get_agent_metadata())


def two_regions():
    """An agent in this process with two separately registered 4 KiB
    regions."""
    return Local("regions", size=8 * KiB, regions=2)


def test_partial_metadata_in_process():
    owner, user = two_regions(), Local("user", size=64 * KiB)
    first, second = ([row] for row in owner.rows)

    def known(rows):
        return user.agent.check_remote_metadata(
            owner.name, user.agent.get_xfer_descs(rows, "DRAM"))

    blob = owner.agent.get_partial_agent_metadata(owner.regs[0], True,
                                                  ["UCX"])
    assert user.agent.add_remote_agent(blob) == owner.name.encode()
    assert user.agent.check_remote_metadata(owner.name)
    assert known(first) and not known(second)
    with pytest.raises(nb.nixlNotFoundError):
        user.agent.prep_xfer_dlist(owner.name, second, "DRAM")

    user.buf[:4 * KiB] = np.frombuffer(pattern(4 * KiB, 2), dtype=np.uint8)
    user.write(owner.name, owner.rows[0][0], 0, 4 * KiB, also=[owner])
    assert bytes(owner.buf[:4 * KiB]) == pattern(4 * KiB, 2)

    blob = owner.agent.get_partial_agent_metadata(owner.regs[1], False,
                                                  ["UCX"])
    user.agent.add_remote_agent(blob)
    assert known(first) and known(second)


def test_partial_metadata_errors():
    owner = two_regions()
    no_conn = owner.agent.get_partial_agent_metadata(owner.regs[0], False,
                                                     ["UCX"])
    fresh = nixl_agent(unique("fresh"),
                       nixl_agent_config(enable_prog_thread=False))
    with pytest.raises(nb.nixlNotFoundError):
        fresh.add_remote_agent(no_conn)  # no connection info yet
    part = owner.agent.get_reg_descs(
        [(owner.rows[0][0], KiB, 0, "")], "DRAM")
    with pytest.raises(nb.nixlNotFoundError):
        owner.agent.get_partial_agent_metadata(part, True, ["UCX"])


# --- descriptor lists --------------------------------------------------------

def test_reg_descs_from_four_tuples(local):
    descs = local.agent.get_reg_descs(
        [(0x1000, 64, 0, "a"), (0x2000, 128, 1, b"b\x00c")], "DRAM")
    assert descs.descCount() == 2
    assert descs.getType() == nb.DRAM_SEG
    assert descs[0] == (0x1000, 64, 0, b"a")
    assert descs[1] == (0x2000, 128, 1, b"b\x00c")


def test_reg_descs_from_numpy_have_empty_meta(local):
    rows = np.array([[0x1000, 64, 0], [0x2000, 128, 0]], dtype=np.uint64)
    descs = local.agent.get_reg_descs(rows, "DRAM")
    assert descs.descCount() == 2
    assert descs[1] == (0x2000, 128, 0, b"")


def test_xfer_descs_from_tuples_and_numpy_agree(local):
    rows = [(0x1000, 64, 0), (0x3000, 32, 0), (0x2000, 16, 0)]
    from_tuples = local.agent.get_xfer_descs(rows, "DRAM")
    from_array = local.agent.get_xfer_descs(
        np.array(rows, dtype=np.uint64), "DRAM")
    assert from_tuples.descCount() == 3
    assert [from_tuples[i] for i in range(3)] == rows
    assert from_tuples == from_array
    assert local.agent.get_xfer_descs(from_tuples) is from_tuples


@pytest.mark.parametrize("mem_type, seg", [
    ("DRAM", "DRAM_SEG"), ("cpu", "DRAM_SEG"),
    ("VRAM", "VRAM_SEG"), ("cuda", "VRAM_SEG"),
    ("FILE", "FILE_SEG"), ("BLOCK", "BLK_SEG"), ("OBJ", "OBJ_SEG")])
def test_memory_type_names(local, mem_type, seg):
    assert (local.agent.get_xfer_descs([(1, 2, 0)], mem_type).getType()
            == getattr(nb, seg))
    assert (local.agent.get_reg_descs([(1, 2, 0, "")], mem_type).getType()
            == getattr(nb, seg))


def test_unknown_memory_type_raises_key_error(local):
    with pytest.raises(KeyError):
        local.agent.get_xfer_descs([(1, 2, 0)], "HBM")
    with pytest.raises(KeyError):
        local.agent.get_reg_descs([(1, 2, 0, "")], "HBM")


@pytest.mark.parametrize("bad", [
    pytest.param(lambda a: a.get_xfer_descs(
        np.zeros((2, 4), dtype=np.uint64), "DRAM"), id="xfer-Nx4"),
    pytest.param(lambda a: a.get_xfer_descs(
        np.zeros(3, dtype=np.uint64), "DRAM"), id="xfer-1d"),
    pytest.param(lambda a: a.get_xfer_descs([(1, 2, 0, "")], "DRAM"),
                 id="xfer-4-tuples"),
    pytest.param(lambda a: a.get_xfer_descs([(1, 2, 0)]), id="xfer-no-type"),
    pytest.param(lambda a: a.get_reg_descs([(1, 2, 0)], "DRAM"),
                 id="reg-3-tuples"),
    pytest.param(lambda a: a.get_reg_descs(
        np.zeros((2, 4), dtype=np.uint64), "DRAM"), id="reg-Nx4"),
    pytest.param(lambda a: a.get_xfer_descs(
        a.get_reg_descs([(1, 2, 0, "")], "DRAM")), id="reg-list-as-xfer"),
    pytest.param(lambda a: a.get_reg_descs(
        a.get_xfer_descs([(1, 2, 0)], "DRAM")), id="xfer-list-as-reg"),
])
def test_bad_descriptor_input_returns_none(local, bad):
    assert bad(local.agent) is None


@pytest.fixture(scope="module")
def torch():
    return pytest.importorskip("torch")


def test_xfer_descs_from_tensors(local, torch):
    t = torch.arange(64, dtype=torch.float32)
    one = local.agent.get_xfer_descs(t)
    assert one.getType() == nb.DRAM_SEG
    assert one.descCount() == 1 and one[0] == (t.data_ptr(), 256, 0)
    parts = [t[:16], t[16:48]]
    many = local.agent.get_xfer_descs(parts)
    assert many.descCount() == 2
    assert many[1] == (parts[1].data_ptr(), 128, 0)


def test_reg_descs_from_tensors(local, torch):
    t = torch.zeros(32, dtype=torch.int64)
    descs = local.agent.get_reg_descs(t)
    assert descs.getType() == nb.DRAM_SEG
    assert descs[0] == (t.data_ptr(), 256, 0, b"")
    assert local.agent.get_reg_descs([t[:8], t[8:]]).descCount() == 2


def test_non_contiguous_tensor_returns_none(local, torch):
    strided = torch.zeros(8, 8)[:, :2]
    assert not strided.is_contiguous()
    whole = torch.zeros(4)
    assert local.agent.get_xfer_descs(strided) is None
    assert local.agent.get_reg_descs(strided) is None
    assert local.agent.get_xfer_descs([whole, strided]) is None
    assert local.agent.get_reg_descs([whole, strided]) is None


def test_descriptor_lists_pickle(local):
    xfer = local.agent.get_xfer_descs([(0x1000, 64, 0), (0x2000, 8, 1)],
                                      "VRAM")
    reg = local.agent.get_reg_descs([(0x1000, 64, 0, b"m\x00")], "DRAM")
    for descs in (xfer, reg):
        back = pickle.loads(pickle.dumps(descs))
        assert back == descs and back.getType() == descs.getType()
        assert local.agent.deserialize_descs(
            local.agent.get_serialized_descs(descs)) == descs


# --- metadata between processes ----------------------------------------------

def test_listener_send_fetch_invalidate(peers):
    """This agent pushes its metadata to the peer's listener, pulls the
    peer's through it, transfers, then invalidates itself at the peer."""
    port = free_port()
    peer = peers(size=MiB, listen_port=port)
    me = Local("listener", size=MiB, enable_listen_thread=True,
               listen_port=free_port())

    me.agent.send_local_metadata(IP, port)
    wait_for(lambda: peer.knows(me.name), "the peer to learn this agent")
    me.agent.fetch_remote_metadata(peer.name, IP, port)
    wait_for(lambda: me.agent.check_remote_metadata(peer.name),
             "this agent to fetch the peer's metadata")

    me.buf[:KiB] = np.frombuffer(pattern(KiB, 3), dtype=np.uint8)
    me.write(peer.name, peer.addr + KiB, 0, KiB, b"via listener")
    assert peer.read(KiB, KiB) == pattern(KiB, 3)
    assert peer.notifs(me.name) == [b"via listener"]

    me.agent.invalidate_local_metadata(IP, port)
    wait_for(lambda: not peer.knows(me.name), "the peer to forget this agent")
    assert me.agent.check_remote_metadata(peer.name)
    me.agent.remove_remote_agent(peer.name)


def test_listener_receives_and_forgets(peers):
    """The peer pushes its metadata to this agent's listener, then
    invalidates it there."""
    port = free_port()
    me = Local("listener", size=MiB, enable_listen_thread=True,
               listen_port=port)
    peer = peers(size=MiB)
    peer.call("send_metadata", ip=IP, port=port)
    wait_for(lambda: me.agent.check_remote_metadata(peer.name),
             "the peer's metadata to arrive")
    peer.call("invalidate", ip=IP, port=port)
    wait_for(lambda: not me.agent.check_remote_metadata(peer.name),
             "the peer's invalidation to arrive")


def test_partial_metadata_over_listener(peers):
    port = free_port()
    peer = peers(size=MiB, listen_port=port)
    owner = two_regions()
    owner.agent.send_partial_agent_metadata(owner.regs[0], True, ["UCX"],
                                            ip_addr=IP, port=port)
    wait_for(lambda: peer.knows(owner.name, [owner.rows[0]]),
             "the peer to learn the first region")
    assert not peer.knows(owner.name, [owner.rows[1]])
    owner.agent.send_partial_agent_metadata(owner.regs[1], False, ["UCX"],
                                            ip_addr=IP, port=port)
    wait_for(lambda: peer.knows(owner.name, [owner.rows[1]]),
             "the peer to learn the second region")


def test_no_address_and_no_store_raises_invalid_param(monkeypatch):
    monkeypatch.delenv("NIXL_ETCD_ENDPOINTS", raising=False)
    monkeypatch.delenv("NIXL_TCPSTORE_ENDPOINT", raising=False)
    agent = nixl_agent(unique("nostore"),
                       nixl_agent_config(enable_prog_thread=False))
    with pytest.raises(nb.nixlInvalidParamError):
        agent.send_local_metadata()
    with pytest.raises(nb.nixlInvalidParamError):
        agent.fetch_remote_metadata("anyone")


def test_etcd_publish_fetch_invalidate(etcd, monkeypatch, peers):
    """send_local_metadata() publishes to etcd, fetch_remote_metadata(name)
    fetches; when the peer invalidates its entry, an agent that fetched
    it forgets it."""
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", etcd)
    peer = peers(size=MiB)
    me = Local("etcd", size=MiB)

    peer.call("send_metadata")
    me.agent.fetch_remote_metadata(peer.name)
    wait_for(lambda: me.agent.check_remote_metadata(peer.name),
             "the peer's metadata from etcd")
    me.agent.send_local_metadata()
    peer.call("fetch_metadata", name=me.name)
    wait_for(lambda: peer.knows(me.name), "the peer to fetch this agent")

    me.buf[:KiB] = np.frombuffer(pattern(KiB, 4), dtype=np.uint8)
    me.write(peer.name, peer.addr, 0, KiB, b"via etcd")
    assert peer.read(0, KiB) == pattern(KiB, 4)
    assert peer.notifs(me.name) == [b"via etcd"]

    peer.call("invalidate")
    wait_for(lambda: not me.agent.check_remote_metadata(peer.name),
             "this agent to drop the peer's invalidated metadata")
    me.agent.invalidate_local_metadata()


def test_etcd_partial_metadata_with_label(etcd, monkeypatch, peers):
    monkeypatch.setenv("NIXL_ETCD_ENDPOINTS", etcd)
    peer = peers(size=MiB)
    owner = two_regions()
    owner.agent.send_partial_agent_metadata(owner.regs[0], True, ["UCX"],
                                            label="first")
    peer.call("fetch_metadata", name=owner.name, label="first")
    wait_for(lambda: peer.knows(owner.name, [owner.rows[0]]),
             "the peer to fetch the labelled partial metadata")
    assert not peer.knows(owner.name, [owner.rows[1]])
    owner.agent.invalidate_local_metadata()


# --- transfers ---------------------------------------------------------------

BLOCK = 4 * KiB


@pytest.mark.parametrize("local_name", ["NIXL_INIT_AGENT", ""])
@pytest.mark.parametrize("as_array", [False, True], ids=["list", "ndarray"])
def test_prepped_read_with_reversed_remote_indices(local, peer, local_name,
                                                   as_array):
    data = pattern(4 * BLOCK, 5)
    peer.fill(0, data)
    local.buf[:4 * BLOCK] = 0
    local_side = local.agent.prep_xfer_dlist(
        local_name, [local.descs(i * BLOCK, BLOCK) for i in range(4)], "DRAM")
    remote_side = local.agent.prep_xfer_dlist(
        peer.name, [(peer.addr + i * BLOCK, BLOCK, 0) for i in range(4)],
        "DRAM")
    local_idx, remote_idx = [0, 1, 2, 3], [3, 2, 1, 0]
    if as_array:
        local_idx = np.array(local_idx, dtype=np.int32)
        remote_idx = np.array(remote_idx, dtype=np.int32)
    tag = unique("read").encode()
    handle = local.agent.make_prepped_xfer(
        "READ", local_side, local_idx, remote_side, remote_idx, tag)
    assert local.agent.transfer(handle) in ("DONE", "PROC")
    assert wait_xfer(local.agent, handle) == "DONE"
    for i in range(4):
        got = bytes(local.buf[i * BLOCK:(i + 1) * BLOCK])
        assert got == data[(3 - i) * BLOCK:(4 - i) * BLOCK], f"block {i}"
    assert peer.notifs(local.name) == [tag]
    local.agent.release_xfer_handle(handle)
    local.agent.release_dlist_handle(local_side)
    local.agent.release_dlist_handle(remote_side)


@pytest.mark.parametrize("as_array", [False, True], ids=["tuples", "ndarray"])
def test_write_with_initialize_xfer(local, peer, as_array):
    """Two descriptors, neither contiguous with the other on either side."""
    local_rows = [local.descs(0, 1000), local.descs(5000, 2000)]
    remote_rows = [(peer.addr + 8 * KiB, 1000, 0), (peer.addr + 100, 2000, 0)]
    if as_array:
        local_rows = np.array(local_rows, dtype=np.uint64)
        remote_rows = np.array(remote_rows, dtype=np.uint64)
    data = pattern(3000, 6)
    local.buf[:1000] = np.frombuffer(data[:1000], dtype=np.uint8)
    local.buf[5000:7000] = np.frombuffer(data[1000:], dtype=np.uint8)
    peer.fill(0, bytes(16 * KiB))
    tag = unique("write").encode()
    handle = local.agent.initialize_xfer(
        "WRITE", local.agent.get_xfer_descs(local_rows, "DRAM"),
        local.agent.get_xfer_descs(remote_rows, "DRAM"), peer.name, tag)
    assert local.agent.transfer(handle) in ("DONE", "PROC")
    assert wait_xfer(local.agent, handle) == "DONE"
    assert peer.notifs(local.name) == [tag]
    assert peer.read(8 * KiB, 1000) == data[:1000]
    assert peer.read(100, 2000) == data[1000:]
    assert peer.read(0, 100) == bytes(100)
    local.agent.release_xfer_handle(handle)


def test_repost_with_new_notification(local, peer):
    """A DONE handle can be posted again; a notif_msg given to transfer()
    replaces the handle's, and later posts without one send it again."""
    handle = local.agent.initialize_xfer(
        "READ", local.agent.get_xfer_descs([local.descs(0, BLOCK)], "DRAM"),
        local.agent.get_xfer_descs([(peer.addr, BLOCK, 0)], "DRAM"),
        peer.name, b"first")
    for seed, notif, expected in [(7, b"", b"first"),
                                  (8, b"second", b"second"),
                                  (9, b"", b"second")]:
        peer.fill(0, pattern(BLOCK, seed))
        assert local.agent.transfer(handle, notif_msg=notif) in ("DONE",
                                                                  "PROC")
        assert wait_xfer(local.agent, handle) == "DONE"
        assert bytes(local.buf[:BLOCK]) == pattern(BLOCK, seed)
        assert peer.notifs(local.name) == [expected]
    local.agent.release_xfer_handle(handle)


def test_repost_of_active_handle_raises(local, peer):
    """Needs a transfer still in progress after transfer() returns; over
    shared memory a whole PEER_SIZE copy may finish inside the call."""
    handle = local.agent.initialize_xfer(
        "WRITE", local.agent.get_xfer_descs([local.descs(0, PEER_SIZE)],
                                            "DRAM"),
        local.agent.get_xfer_descs([(peer.addr, PEER_SIZE, 0)], "DRAM"),
        peer.name, b"")
    seen_active = raised = False
    for _ in range(5):
        if local.agent.transfer(handle) == "PROC":
            seen_active = True
            try:
                local.agent.transfer(handle)
            except nb.nixlRepostActiveError:
                raised = True
        assert wait_xfer(local.agent, handle) == "DONE"
        if raised:
            break
    local.agent.release_xfer_handle(handle)
    if not seen_active:
        pytest.skip("every transfer finished inside transfer()")
    assert raised, "reposting a PROC handle did not raise"


def test_read_notification_arrives_after_the_data(local, peer):
    """The peer overwrites its buffer as soon as the notification of a
    READ from it arrives; the reader must still see the old contents."""
    descs = (local.agent.get_xfer_descs([local.descs(0, PEER_SIZE)], "DRAM"),
             local.agent.get_xfer_descs([(peer.addr, PEER_SIZE, 0)], "DRAM"))
    for attempt in range(3):
        old, new = 0x11 + attempt, 0xA0 + attempt
        peer.call("memset", byte=old)
        local.buf[:] = 0
        tag = unique("pull").encode()
        peer.send("fill_on_notif", tag=b64(tag), byte=new, timeout=WAIT_S)
        handle = local.agent.initialize_xfer("READ", *descs, peer.name, tag)
        local.agent.transfer(handle)
        assert wait_xfer(local.agent, handle) == "DONE"
        assert peer.reply()["notifs"] == {local.name: [b64(tag)]}
        values = np.unique(local.buf)
        assert values.tolist() == [old], f"attempt {attempt}: read {values}"
        assert peer.read(PEER_SIZE - 1, 1) == bytes([new])
        local.agent.release_xfer_handle(handle)


def test_release_handles_twice_is_harmless(local, peer):
    side = local.agent.prep_xfer_dlist("", [local.descs(0, KiB)], "DRAM")
    handle = local.agent.initialize_xfer(
        "WRITE", local.agent.get_xfer_descs([local.descs(0, KiB)], "DRAM"),
        local.agent.get_xfer_descs([(peer.addr, KiB, 0)], "DRAM"),
        peer.name, b"")
    local.agent.transfer(handle)
    assert wait_xfer(local.agent, handle) == "DONE"
    for _ in range(2):
        local.agent.release_xfer_handle(handle)
        local.agent.release_dlist_handle(side)


# --- notifications -----------------------------------------------------------

def test_get_new_notifs_maps_agent_names_to_lists_of_bytes(local, peer):
    msgs = [b"one", b"two", b"three"]
    for msg in msgs:
        peer.send_notif(local, msg)
    got = {}

    def all_arrived():
        for name, new in local.agent.get_new_notifs().items():
            got.setdefault(name, []).extend(new)
        return sum(map(len, got.values())) >= len(msgs)

    wait_for(all_arrived, "three notifications")
    assert got == {peer.name: msgs}
    assert all(type(m) is bytes for m in got[peer.name])
    assert local.agent.get_new_notifs() == {}


def test_send_notif_standalone(local, peer):
    local.agent.send_notif(peer.name, b"standalone")
    assert peer.notifs(local.name) == [b"standalone"]


def test_binary_notification_with_nul(local, peer):
    msg = b"\x00head\x00\xff\x00tail\x00"
    local.agent.send_notif(peer.name, msg)
    assert peer.notifs(local.name) == [msg]
    local.write(peer.name, peer.addr, 0, 8, msg)
    assert peer.notifs(local.name) == [msg]
    peer.send_notif(local, msg)
    assert local.notifs(peer.name) == [msg]


@pytest.mark.parametrize("size", [16 * KiB, 60 * KiB, 64 * KiB],
                         ids=["16KiB", "60KiB", "64KiB"])
def test_large_notification(local, peer, size):
    msg = pattern(size, size)
    local.agent.send_notif(peer.name, msg)
    assert peer.notifs(local.name) == [msg]
    local.write(peer.name, peer.addr, 0, 8, msg)
    assert peer.notifs(local.name) == [msg]
    peer.send_notif(local, msg)
    assert local.notifs(peer.name) == [msg]


def test_update_notifs_accumulates(local, peer):
    for msg in (b"u1", b"u2"):
        peer.send_notif(local, msg)
    wait_for(lambda: len(local.agent.update_notifs().get(peer.name, [])) >= 2,
             "two notifications")
    peer.send_notif(local, b"u3")
    wait_for(lambda: len(local.agent.update_notifs().get(peer.name, [])) >= 3,
             "a third notification")
    assert local.agent.update_notifs()[peer.name] == [b"u1", b"u2", b"u3"]
    assert local.agent.get_new_notifs() == {}
    for msg in (b"u1", b"u2", b"u3"):
        assert local.agent.check_remote_xfer_done(peer.name, msg)
    assert local.agent.update_notifs().get(peer.name) == []


def test_check_remote_xfer_done_matching_and_consumption(local, peer):
    """tag_is_prefix=True matches a prefix, False a substring; the first
    match in arrival order is removed, and only it."""
    msgs = [b"req-1:done", b"req-12:done", b"other", b"xx-req-1"]
    for msg in msgs:
        peer.send_notif(local, msg)
    wait_for(lambda: len(local.agent.update_notifs().get(peer.name, [])) >= 4,
             "four notifications")
    done = local.agent.check_remote_xfer_done
    remaining = local.agent.update_notifs

    assert done(peer.name, b"req-1") is True
    assert remaining()[peer.name] == msgs[1:]
    assert done(peer.name, b"req-1", tag_is_prefix=True) is True
    assert remaining()[peer.name] == [b"other", b"xx-req-1"]
    assert done(peer.name, b"req-1", tag_is_prefix=True) is False
    assert done(peer.name, b"req-1", tag_is_prefix=False) is True
    assert remaining()[peer.name] == [b"other"]
    assert done(peer.name, b"the", tag_is_prefix=False) is True
    assert done(unique("stranger"), b"") is False

    peer.send_notif(local, b"late:done")
    wait_for(lambda: done(peer.name, b"late:done"),
             "check_remote_xfer_done to see a new notification")
    assert remaining()[peer.name] == []


# --- telemetry ---------------------------------------------------------------

@pytest.mark.parametrize("remote_order, desc_count", [
    ([0, 1, 2, 3], 1), ([3, 2, 1, 0], 4)], ids=["contiguous", "reversed"])
def test_telemetry_counts_merged_descriptors(local, peer, remote_order,
                                             desc_count):
    local_side = local.agent.prep_xfer_dlist(
        "", [local.descs(i * BLOCK, BLOCK) for i in range(4)], "DRAM")
    remote_side = local.agent.prep_xfer_dlist(
        peer.name, [(peer.addr + i * BLOCK, BLOCK, 0) for i in range(4)],
        "DRAM")
    handle = local.agent.make_prepped_xfer(
        "READ", local_side, [0, 1, 2, 3], remote_side, remote_order)
    local.agent.transfer(handle)
    assert wait_xfer(local.agent, handle) == "DONE"
    telemetry = local.agent.get_xfer_telemetry(handle)
    assert telemetry.totalBytes == 4 * BLOCK
    assert telemetry.descCount == desc_count
    local.agent.release_xfer_handle(handle)


def test_telemetry_times_are_monotonic_microseconds(local, peer):
    handle = local.agent.initialize_xfer(
        "WRITE", local.agent.get_xfer_descs([local.descs(0, PEER_SIZE)],
                                            "DRAM"),
        local.agent.get_xfer_descs([(peer.addr, PEER_SIZE, 0)], "DRAM"),
        peer.name, b"")
    before = time.monotonic_ns() // 1000
    local.agent.transfer(handle)
    assert wait_xfer(local.agent, handle) == "DONE"
    after = time.monotonic_ns() // 1000
    t = local.agent.get_xfer_telemetry(handle)
    assert t.totalBytes == PEER_SIZE and t.descCount == 1
    assert before <= t.startTime <= after
    # Both run from startTime. postDuration is not always the smaller: a
    # transfer that completes inside the post (NIXL's UCX over shared
    # memory) can be stamped done before the post returns.
    assert 0 <= t.postDuration <= after - before
    # 32 MiB take well over 100 us to copy; in ns it would exceed the wall.
    assert 100 <= t.xferDuration <= after - before
    local.agent.release_xfer_handle(handle)


# --- errors ------------------------------------------------------------------

@pytest.mark.parametrize("start, size", [
    (PEER_SIZE - 512, KiB), (PEER_SIZE + 64 * KiB, KiB), (-KiB, 2 * KiB)],
    ids=["straddles-end", "past-end", "straddles-start"])
def test_remote_range_outside_registration_is_refused(local, peer, start,
                                                      size):
    far = [(peer.addr + start, size, 0)]
    with pytest.raises(nb.nixlNotFoundError):
        local.agent.prep_xfer_dlist(peer.name, far, "DRAM")
    with pytest.raises(nb.nixlNotFoundError):
        local.agent.initialize_xfer(
            "READ", local.agent.get_xfer_descs([local.descs(0, size)],
                                               "DRAM"),
            local.agent.get_xfer_descs(far, "DRAM"), peer.name, b"")


def test_unregistered_local_memory_is_refused(local, peer):
    other = np.zeros(KiB, dtype=np.uint8)
    near = [(other.ctypes.data, KiB, 0)]
    with pytest.raises(nb.nixlNotFoundError):
        local.agent.prep_xfer_dlist("NIXL_INIT_AGENT", near, "DRAM")
    with pytest.raises(nb.nixlNotFoundError):
        local.agent.initialize_xfer(
            "WRITE", local.agent.get_xfer_descs(near, "DRAM"),
            local.agent.get_xfer_descs([(peer.addr, KiB, 0)], "DRAM"),
            peer.name, b"")


def test_unknown_remote_agent(local):
    stranger = unique("stranger")
    rows = [local.descs(0, KiB)]
    assert local.agent.check_remote_metadata(stranger) is False
    with pytest.raises(nb.nixlNotFoundError):
        local.agent.prep_xfer_dlist(stranger, rows, "DRAM")
    with pytest.raises(nb.nixlNotFoundError):
        local.agent.initialize_xfer(
            "WRITE", local.agent.get_xfer_descs(rows, "DRAM"),
            local.agent.get_xfer_descs(rows, "DRAM"), stranger, b"")
    with pytest.raises(nb.nixlNotFoundError):
        local.agent.send_notif(stranger, b"hello?")


@pytest.mark.parametrize("local_idx, remote_idx", [
    ([4], [0]), ([0], [4]), ([-1], [0]), ([0, 1], [0]), ([], [])],
    ids=["local-past-end", "remote-past-end", "negative", "count-mismatch",
         "empty"])
def test_bad_indices_raise_invalid_param(local, peer, local_idx, remote_idx):
    rows = [(0, KiB), (KiB, KiB), (2 * KiB, KiB), (3 * KiB, KiB)]
    local_side = local.agent.prep_xfer_dlist(
        "", [local.descs(off, size) for off, size in rows], "DRAM")
    remote_side = local.agent.prep_xfer_dlist(
        peer.name, [(peer.addr + off, size, 0) for off, size in rows], "DRAM")
    with pytest.raises(nb.nixlInvalidParamError):
        local.agent.make_prepped_xfer("READ", local_side, local_idx,
                                      remote_side, remote_idx)
    local.agent.release_dlist_handle(local_side)
    local.agent.release_dlist_handle(remote_side)


@pytest.mark.parametrize("remote_rows", [
    [(0, 2 * KiB)], [(0, KiB), (8 * KiB, 3 * KiB)]],
    ids=["length-mismatch", "count-mismatch"])
def test_mismatched_descriptor_lists_raise_invalid_param(local, peer,
                                                         remote_rows):
    with pytest.raises(nb.nixlInvalidParamError):
        local.agent.initialize_xfer(
            "WRITE", local.agent.get_xfer_descs([local.descs(0, 4 * KiB)],
                                                "DRAM"),
            local.agent.get_xfer_descs(
                [(peer.addr + off, size, 0) for off, size in remote_rows],
                "DRAM"),
            peer.name, b"")


def test_unknown_operation_raises_key_error(local, peer):
    rows = [local.descs(0, KiB)]
    with pytest.raises(KeyError):
        local.agent.initialize_xfer(
            "COPY", local.agent.get_xfer_descs(rows, "DRAM"),
            local.agent.get_xfer_descs([(peer.addr, KiB, 0)], "DRAM"),
            peer.name, b"")


def test_killed_peer_fails_transfers_and_notifications(peers):
    """Both agents are peer processes: an agent that talked to a killed
    process is not safe to keep in this one (see README)."""
    initiator, target = peers(prefix="initiator"), peers(prefix="target")
    initiator.call("add_remote", metadata=b64(target.metadata))

    def post(**args):
        return initiator.call("xfer", op="WRITE", remote=target.name,
                              remote_addr=target.addr, **args)["handle"]

    def wait(handle):
        return initiator.call("wait", handle=handle, timeout=WAIT_S)["state"]

    first = post(size=KiB, notif=b64(b"before"))
    assert wait(first) == "DONE"
    assert target.notifs(initiator.name) == [b"before"]

    during = post(size=PEER_SIZE)
    target.kill()
    try:
        assert wait(during) in ("DONE", "ERR"), "still PROC after the kill"
    except PeerError as e:
        assert str(e).startswith("nixl"), e

    def repost_fails():
        try:
            if initiator.call("repost", handle=first)["state"] == "PROC":
                wait(first)
        except PeerError as e:
            return str(e)

    error = wait_for(repost_fails, "a repost to a killed peer to fail")
    assert error.startswith("nixlRemoteDisconnectError"), error
    with pytest.raises(PeerError, match="^nixlRemoteDisconnectError"):
        initiator.call("send_notif", agent=target.name, msg=b64(b"gone?"))
