# SPDX-License-Identifier: Apache-2.0
"""Transfers the target must refuse: memory it never registered, a range
running past the end of a region, memory it unregistered. Each refusal
fails the call and writes nothing on either side."""

import logging
import time

import pytest

from conftest import MiB, pattern


@pytest.fixture(scope="module")
def peer(shared_peer):
    return shared_peer


@pytest.fixture(scope="module")
def engine(shared_engine):
    return shared_engine


def wait_status(engine, bid, timeout=10.0):
    deadline = time.monotonic() + timeout
    while (st := engine.transfer_check_status(bid)) == 0:
        assert time.monotonic() < deadline, "batch never became final"
        time.sleep(0.001)
    return st


def test_write_to_unregistered_remote_memory(engine, local, peer, caplog):
    dst, n = peer.info["unreg"], 4096
    before = pattern(n, 1)
    peer.fill(dst, before)
    local.put(0, pattern(n, 2))
    with caplog.at_level(logging.WARNING, logger="kvt"):
        assert engine.transfer_sync_write(peer.segment, local.addr, dst,
                                          n) == -1
    assert "KVT_ERR_ACCESS" in caplog.text
    assert peer.read(dst, n) == before
    bid = engine.transfer_submit_write(peer.segment, local.addr, dst, n)
    assert bid != 0
    assert wait_status(engine, bid) == -1
    assert peer.read(dst, n) == before


def test_read_from_unregistered_remote_memory(engine, local, peer):
    src, n = peer.info["unreg"], 1000
    local.put(0, pattern(n, 3))
    assert engine.transfer_sync_read(peer.segment, local.addr, src, n) == -1
    assert local.get(0, n) == pattern(n, 3)
    bid = engine.batch_transfer_async_read(peer.segment, [local.addr], [src],
                                           [n])
    assert engine.get_batch_transfer_status([bid]) == -1
    assert local.get(0, n) == pattern(n, 3)


@pytest.mark.parametrize("region,length", [("reg", 4 * MiB),
                                           ("managed", 4 * MiB)])
def test_range_crossing_end_of_region(engine, local, peer, region, length):
    end = peer.info[region] + length
    tail = pattern(100, 4)
    peer.fill(end - 100, tail)
    local.put(0, pattern(200, 5))
    assert engine.transfer_sync_write(peer.segment, local.addr, end - 100,
                                      200) == -1
    assert peer.read(end - 100, 100) == tail
    assert engine.transfer_sync_read(peer.segment, local.addr, end - 100,
                                     200) == -1
    assert local.get(0, 200) == pattern(200, 5)
    # Exactly up to the end is fine.
    assert engine.transfer_sync_write(peer.segment, local.addr, end - 100,
                                      100) == 0
    assert peer.read(end - 100, 100) == pattern(200, 5)[:100]


def test_one_bad_descriptor_fails_the_batch(engine, local, peer):
    good, bad = peer.info["reg"], peer.info["unreg"]
    before = pattern(512, 6)
    peer.fill(bad, before)
    local.put(0, pattern(1024, 7))
    assert engine.batch_transfer_sync_write(
        peer.segment, [local.addr, local.addr + 512], [good, bad],
        [512, 512]) == -1
    assert peer.read(bad, 512) == before
    bid = engine.batch_transfer_async_write(
        peer.segment, [local.addr, local.addr + 512], [good, bad],
        [512, 512])
    assert wait_status(engine, bid) == -1


def test_memory_unregistered_by_target(engine, local, peer, caplog):
    region = peer.info["batch"][1]
    n = peer.info["batch_len"]
    local.put(0, pattern(n, 8))
    assert engine.transfer_sync_write(peer.segment, local.addr, region,
                                      n) == 0
    assert peer.read(region, n) == pattern(n, 8)

    assert peer.call(cmd="unregister", addr=region)["rc"] == 0
    local.put(0, pattern(n, 9))
    with caplog.at_level(logging.WARNING, logger="kvt"):
        assert engine.transfer_sync_write(peer.segment, local.addr, region,
                                          n) == -1
    assert "KVT_ERR_ACCESS" in caplog.text
    assert peer.read(region, n) == pattern(n, 8)
    assert engine.transfer_sync_read(peer.segment, local.addr, region,
                                     n) == -1
    assert local.get(0, n) == pattern(n, 9)
    bid = engine.transfer_submit_write(peer.segment, local.addr, region, n)
    assert wait_status(engine, bid) == -1
    assert peer.read(region, n) == pattern(n, 8)

    # Registered again, it is writable again.
    assert peer.call(cmd="register", addr=region, len=n)["rc"] == 0
    assert engine.transfer_sync_write(peer.segment, local.addr, region,
                                      n) == 0
    assert peer.read(region, n) == pattern(n, 9)


def test_unregistered_local_memory(engine, peer, caplog):
    import mmap
    from conftest import address_of
    m = mmap.mmap(-1, 4096)
    with caplog.at_level(logging.WARNING, logger="kvt"):
        assert engine.transfer_sync_write(peer.segment, address_of(m),
                                          peer.info["reg"], 4096) == -1
    assert "KVT_ERR_NOT_REGISTERED" in caplog.text
