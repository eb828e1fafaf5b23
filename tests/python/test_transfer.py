# SPDX-License-Identifier: Apache-2.0
"""Transfers between this process and a peer.py process on loopback, each
checked byte for byte on both sides."""

import base64
import logging
import threading
import time

import pytest

from conftest import MiB, pattern
from mooncake.engine import TransferNotify, TransferOpcode

# Descriptor sizes: tiny, odd, around a page, and 3 MiB (two slices of
# kvt's former default; striping over connections is the C conformance
# suite's).
SIZES = [1, 7, 4096, 65537, 3 * MiB + 5]


@pytest.fixture(scope="module")
def peer(shared_peer):
    return shared_peer


@pytest.fixture(scope="module")
def engine(shared_engine):
    return shared_engine


@pytest.mark.parametrize("size", SIZES)
def test_transfer_sync_write(engine, local, peer, size):
    data = pattern(size, size)
    local.put(0, data)
    dst = peer.info["reg"] + 3
    assert engine.transfer_sync_write(peer.segment, local.addr, dst,
                                      size) == 0
    assert peer.read(dst, size) == data


@pytest.mark.parametrize("size", SIZES)
def test_transfer_sync_read(engine, local, peer, size):
    data = pattern(size, size + 1)
    src = peer.info["managed"] + 11
    peer.fill(src, data)
    local.put(0, bytes(size))
    assert engine.transfer_sync_read(peer.segment, local.addr + 1, src,
                                     size) == 0
    assert local.get(1, size) == data


def test_transfer_sync_with_opcode(engine, local, peer):
    data = pattern(5000, 3)
    local.put(0, data)
    dst = peer.info["batch"][0]
    for op in (TransferOpcode.Write, TransferOpcode.WRITE, 1):
        peer.fill(dst, bytes(5000))
        assert engine.transfer_sync(peer.segment, local.addr, dst, 5000,
                                    op) == 0
        assert peer.read(dst, 5000) == data
    peer.fill(dst, pattern(5000, 4))
    for op in (TransferOpcode.Read, 0):
        local.put(8192, bytes(5000))
        assert engine.transfer_sync(peer.segment, local.addr + 8192, dst,
                                    5000, opcode=op) == 0
        assert local.get(8192, 5000) == pattern(5000, 4)


def scatter(n, size, seed):
    """n pieces of local and remote offsets that do not overlap."""
    pieces = []
    for i in range(n):
        length = size + i * 13
        pieces.append((i * (size + 4096), i * (size + 8192) + 1, length,
                       pattern(length, seed + i)))
    return pieces


def test_batch_transfer_sync_write(engine, local, peer):
    pieces = scatter(20, 3000, 10)
    base = peer.info["reg"]
    for lo, _, _, data in pieces:
        local.put(lo, data)
    assert engine.batch_transfer_sync_write(
        peer.segment, [local.addr + lo for lo, _, _, _ in pieces],
        [base + ro for _, ro, _, _ in pieces],
        [n for _, _, n, _ in pieces]) == 0
    for _, ro, n, data in pieces:
        assert peer.read(base + ro, n) == data


def test_batch_transfer_sync_read(engine, local, peer):
    pieces = scatter(100, 1000, 20)  # more than the 64-slot pooled batch
    base = peer.info["managed"]
    for _, ro, _, data in pieces:
        peer.fill(base + ro, data)
    assert engine.batch_transfer_sync_read(
        peer.segment, tuple(local.addr + lo for lo, _, _, _ in pieces),
        tuple(base + ro for _, ro, _, _ in pieces),
        tuple(n for _, _, n, _ in pieces)) == 0
    for lo, _, n, data in pieces:
        assert local.get(lo, n) == data


def test_batch_transfer_sync_large(engine, local, peer):
    # 3 x 1 MiB + a zero-length piece, which moves nothing and succeeds.
    data = pattern(3 * MiB, 99)
    local.put(0, data)
    base = peer.info["reg"]
    assert engine.batch_transfer_sync(
        peer.segment, [local.addr + i * MiB for i in range(3)] + [local.addr],
        [base + i * MiB for i in range(3)] + [base], [MiB] * 3 + [0],
        TransferOpcode.Write) == 0
    assert peer.read(base, 3 * MiB) == data
    assert engine.batch_transfer_sync_write(peer.segment, [], [], []) == 0


def test_mismatched_lists(engine, local, peer, caplog):
    with caplog.at_level(logging.ERROR, logger="kvt"):
        assert engine.batch_transfer_sync_write(
            peer.segment, [local.addr], [peer.info["reg"]], [1, 2]) == -1
        assert engine.batch_transfer_async_read(
            peer.segment, [local.addr], [], [1]) == 0
    assert "different sizes" in caplog.text


def test_batch_transfer_async(engine, local, peer):
    w = scatter(8, 20000, 30)
    r = scatter(8, 7000, 40)
    wbase, rbase = peer.info["reg"], peer.info["managed"]
    for lo, _, _, data in w:
        local.put(lo, data)
    for _, ro, _, data in r:
        peer.fill(rbase + ro, data)
    rloc = 4 * MiB
    wid = engine.batch_transfer_async_write(
        peer.segment, [local.addr + lo for lo, _, _, _ in w],
        [wbase + ro for _, ro, _, _ in w], [n for _, _, n, _ in w])
    rid = engine.batch_transfer_async_read(
        peer.segment, [local.addr + rloc + lo for lo, _, _, _ in r],
        [rbase + ro for _, ro, _, _ in r], [n for _, _, n, _ in r])
    oid = engine.batch_transfer_async(
        peer.segment, [local.addr], [peer.info["batch"][1]], [4096],
        TransferOpcode.Write)
    assert 0 not in (wid, rid, oid) and len({wid, rid, oid}) == 3
    assert engine.get_batch_transfer_status([wid, rid, oid]) == 0
    for _, ro, n, data in w:
        assert peer.read(wbase + ro, n) == data
    for lo, _, n, data in r:
        assert local.get(rloc + lo, n) == data
    assert peer.read(peer.info["batch"][1], 4096) == local.get(0, 4096)
    # get_batch_transfer_status freed the ids.
    assert engine.transfer_check_status(wid) == -1
    assert engine.get_batch_transfer_status([rid]) == -1


def test_transfer_submit_write_and_check_status(engine, local, peer):
    data = pattern(300000, 50)
    local.put(0, data)
    dst = peer.info["reg"] + 100
    bid = engine.transfer_submit_write(peer.segment, local.addr, dst,
                                       len(data))
    assert bid != 0
    deadline = time.monotonic() + 10
    while (st := engine.transfer_check_status(bid)) == 0:
        assert time.monotonic() < deadline
        time.sleep(0.001)
    assert st == 1
    assert peer.read(dst, len(data)) == data
    # Completed ids are freed by the check that saw them complete.
    assert engine.transfer_check_status(bid) == -1


def test_many_ids_are_recycled(engine, local, peer):
    local.put(0, pattern(64, 60))
    ids = [engine.transfer_submit_write(peer.segment, local.addr + i,
                                        peer.info["batch"][0] + i * 64, 1)
           for i in range(200)]
    assert len(set(ids)) == 200 and 0 not in ids
    assert engine.get_batch_transfer_status(ids[:100]) == 0
    for bid in ids[100:]:
        while (st := engine.transfer_check_status(bid)) == 0:
            time.sleep(0.001)
        assert st == 1
    more = [engine.transfer_submit_write(peer.segment, local.addr,
                                         peer.info["batch"][0], 1)
            for _ in range(10)]
    assert not set(more) & set(ids)  # reused slots get new generations
    assert engine.get_batch_transfer_status(more + more) == 0


def test_concurrent_threads(engine, local, peer):
    """Eight threads write their own ranges at once (the GIL is released
    during each transfer, so several wait on the same connections); every
    call returns, and every byte lands where it should."""
    n, size, rounds = 8, 256 * 1024, 50
    base = peer.info["reg"]
    errors = []
    done = [0] * n

    def worker(i):
        data = pattern(size, 70 + i)
        local.put(i * size, data)
        for _ in range(rounds):
            if engine.transfer_sync_write(peer.segment, local.addr + i * size,
                                          base + i * size, size) != 0:
                errors.append(i)
            done[i] += 1

    # Daemon threads: a call that never returned must fail the test, not
    # hang the interpreter at exit.
    threads = [threading.Thread(target=worker, args=(i,), daemon=True)
               for i in range(n)]
    for t in threads:
        t.start()
    deadline = time.monotonic() + 60
    for t in threads:
        t.join(max(0.0, deadline - time.monotonic()))
    assert done == [rounds] * n, "some transfer_sync_write never returned"
    assert not errors
    for i in range(n):
        assert peer.read(base + i * size, size) == pattern(size, 70 + i)


def test_get_first_buffer_address(engine, peer):
    lowest = min([peer.info["managed"], peer.info["reg"]] +
                 peer.info["batch"])
    assert engine.get_first_buffer_address(peer.segment) == lowest


def test_send_probe(engine, peer):
    assert engine.send_probe(peer.segment) == 0
    assert engine.send_probe(peer_server_name=peer.segment) == 0


def test_notify_with_transfer(engine, local, peer):
    data = pattern(200000, 80)
    local.put(0, data)
    dst = peer.info["reg"] + 4096
    peer.call(cmd="notifies")  # drain
    assert engine.transfer_sync(peer.segment, local.addr, dst, len(data),
                                TransferOpcode.Write,
                                TransferNotify("req-7", "kv done")) == 0
    out = peer.call(cmd="notifies", min=1, check_addr=dst,
                    check_len=len(data))
    assert out["notifies"] == [["req-7", "kv done"]]
    # The bytes had landed when the notification was seen.
    assert base64.b64decode(out["data"]) == data

    assert engine.batch_transfer_sync(
        peer.segment, [local.addr, local.addr + 10], [dst, dst + 10],
        [5, 5], TransferOpcode.Read,
        notify=TransferNotify("réq", "ünïcode ✓")) == 0
    assert engine.send_notify(peer.segment,
                              TransferNotify(b"bytes-name", b"\x00\x01")) == 0
    out = peer.call(cmd="notifies", min=2)
    assert out["notifies"] == [["réq", "ünïcode ✓"],
                               ["bytes-name", "\x00\x01"]]


def test_get_notifies(engine, peer):
    me = f"127.0.0.1:{engine.get_rpc_port()}"
    engine.get_notifies()  # drain anything earlier
    for i in range(40):  # more than one internal chunk of 16
        assert peer.call(cmd="notify", target=me, name=f"n{i}",
                         msg="m" * i)["rc"] == 0
    got = []
    deadline = time.monotonic() + 10
    while len(got) < 40 and time.monotonic() < deadline:
        got += engine.get_notifies()
        time.sleep(0.01)
    assert [(n.name, n.msg) for n in got] == \
        [(f"n{i}", "m" * i) for i in range(40)]
    assert engine.get_notifies() == []


@pytest.mark.parametrize("spin", ["0", "50", "bogus"])
def test_small_sync_calls_with_and_without_polling(peer, spin):
    """Small synchronous transfers over tcp poll their batch before they
    sleep (KVT_SYNC_SPIN_US, default 50 us; 0 never polls; a value that is
    not a number keeps the default): the bytes and the failures are the
    same either way."""
    import os
    import subprocess
    import sys
    dst = peer.info["reg"] + 64
    code = f"""
import ctypes
from mooncake.engine import TransferEngine
e = TransferEngine()
assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
buf = ctypes.create_string_buffer(b"spin-" + b"x" * 4091, 4096)
assert e.register_memory(ctypes.addressof(buf), 4096) == 0
for n in (1, 100, 4096):
    assert e.transfer_sync_write({peer.segment!r}, ctypes.addressof(buf),
                                 {dst}, n) == 0
back = ctypes.create_string_buffer(4096)
assert e.register_memory(ctypes.addressof(back), 4096) == 0
assert e.transfer_sync_read({peer.segment!r}, ctypes.addressof(back),
                            {dst}, 4096) == 0
assert back.raw == buf.raw
# Past the peer's memory: refused by the target, -1 in both modes.
assert e.transfer_sync_write({peer.segment!r}, ctypes.addressof(buf),
                             8, 4096) == -1
"""
    env = dict(os.environ, KVT_SYNC_SPIN_US=spin)
    subprocess.run([sys.executable, "-c", code], env=env, check=True,
                   timeout=60)
    assert peer.read(dst, 4096) == b"spin-" + b"x" * 4091
