# SPDX-License-Identifier: Apache-2.0
"""Engines left to pick their transport, as Mooncake callers that pass
"rdma" (or nothing) get: between two processes on one host kvt may use
its shared-memory transport instead of tcp. The same checks hold."""

import base64
import logging
import os
import subprocess

import pytest

from conftest import MiB, Local, Peer, new_engine, pattern
from mooncake.engine import TransferNotify, TransferOpcode


@pytest.fixture(scope="module", params=["", "rdma"])
def pair(request):
    peer = Peer(protocol=request.param)
    peer.protocol = request.param
    engine = new_engine(protocol=request.param)
    local = Local(engine, 8 * MiB)
    yield engine, local, peer
    peer.close()


def test_transport(pair):
    """rdma is served by ucx when kvt has it (Mooncake's RDMA); else, as
    with no protocol, by one of kvt's own."""
    engine, _, peer = pair
    t = engine.get_segment_transport(peer.segment)
    info = subprocess.run([os.environ["KVT_BIN"], "info"], check=True,
                          capture_output=True, text=True).stdout
    kvt_has_ucx = "ucx (" in info
    if peer.protocol == "rdma" and kvt_has_ucx:
        assert t == "ucx"
    else:
        assert t in ("tcp", "shm")
    # The reason names the transport chosen first, then the others.
    why = engine.get_segment_transport_reason(peer.segment)
    assert why.startswith(t + " ("), why
    others = {"tcp", "shm", "ucx"} - {t} if kvt_has_ucx else {"tcp", "shm"} - {t}
    for o in others:
        assert "; %s: " % o in why, why


def test_sync_and_batch(pair):
    engine, local, peer = pair
    data = pattern(3 * MiB + 3, 1)
    local.put(0, data)
    dst = peer.info["reg"] + 1
    assert engine.transfer_sync_write(peer.segment, local.addr, dst,
                                      len(data)) == 0
    assert peer.read(dst, len(data)) == data
    # The managed buffer (kvt_mem_alloc memory, which same-host peers may
    # map directly) in both directions.
    src = peer.info["managed"]
    peer.fill(src, pattern(70000, 2))
    assert engine.transfer_sync_read(peer.segment, local.addr + 4 * MiB, src,
                                     70000) == 0
    assert local.get(4 * MiB, 70000) == pattern(70000, 2)
    bid = engine.batch_transfer_async_write(
        peer.segment, [local.addr + i * 1000 for i in range(10)],
        [src + i * 2000 for i in range(10)], [1000] * 10)
    assert engine.get_batch_transfer_status([bid]) == 0
    for i in range(10):
        assert peer.read(src + i * 2000, 1000) == data[i * 1000:
                                                       (i + 1) * 1000]


def test_refusals(pair, caplog):
    engine, local, peer = pair
    before = pattern(4096, 3)
    peer.fill(peer.info["unreg"], before)
    with caplog.at_level(logging.WARNING, logger="kvt"):
        assert engine.transfer_sync_write(peer.segment, local.addr,
                                          peer.info["unreg"], 4096) == -1
    assert peer.read(peer.info["unreg"], 4096) == before
    end = peer.info["managed"] + peer.info["managed_len"]
    tail = pattern(100, 4)
    peer.fill(end - 100, tail)
    assert engine.transfer_sync_write(peer.segment, local.addr, end - 100,
                                      200) == -1
    assert peer.read(end - 100, 100) == tail


def test_notification_after_data(pair):
    engine, local, peer = pair
    data = pattern(MiB, 5)
    local.put(0, data)
    dst = peer.info["reg"]
    peer.call(cmd="notifies")
    assert engine.transfer_sync(peer.segment, local.addr, dst, MiB,
                                TransferOpcode.Write,
                                TransferNotify("room-1", "sent")) == 0
    out = peer.call(cmd="notifies", min=1, check_addr=dst, check_len=MiB)
    assert out["notifies"] == [["room-1", "sent"]]
    assert base64.b64decode(out["data"]) == data
