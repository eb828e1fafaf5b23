# SPDX-License-Identifier: Apache-2.0
"""Peers that cannot answer: nobody listening, killed (SIGKILL), stopped
(SIGSTOP). Every call fails, and within the transfer timeout configured in
this process's environment (MC_TRANSFER_TIMEOUT, see conftest.py)."""

import logging
import socket
import threading
import time

import pytest

from conftest import MiB, TIMEOUT_S, Elapsed, Local, Peer, new_engine, pattern

# Scheduling slack on a loaded two-core machine.
SLACK_S = 1.0


def closed_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


@pytest.fixture
def local(engine):
    return Local(engine, 8 * MiB)


def test_unreachable_peer(engine, local, caplog):
    target = f"127.0.0.1:{closed_port()}"
    with caplog.at_level(logging.WARNING, logger="kvt"):
        with Elapsed() as t:
            assert engine.transfer_sync_write(target, local.addr, 4096,
                                              4096) == -1
            assert engine.transfer_sync_read(target, local.addr, 4096,
                                             4096) == -1
            assert engine.batch_transfer_sync_write(target, [local.addr],
                                                    [0], [1]) == -1
            assert engine.batch_transfer_async_write(target, [local.addr],
                                                     [0], [1]) == 0
            assert engine.transfer_submit_write(target, local.addr, 0,
                                                1) == 0
            assert engine.send_probe(target) == -1
            assert engine.get_first_buffer_address(target) == 0
    assert t.s < TIMEOUT_S + SLACK_S
    assert "KVT_ERR_UNREACHABLE" in caplog.text
    with pytest.raises(ValueError):
        engine.transfer_sync_write("127.0.0.1\0", local.addr, 0, 1)
    assert engine.transfer_sync_write("no-port-here", local.addr, 0, 1) == -1


def test_killed_peer(engine, local, peer, caplog):
    dst = peer.info["reg"]
    local.put(0, pattern(4096, 1))
    assert engine.transfer_sync_write(peer.segment, local.addr, dst,
                                      4096) == 0
    peer.kill()
    with caplog.at_level(logging.WARNING, logger="kvt"):
        with Elapsed() as t:
            assert engine.transfer_sync_write(peer.segment, local.addr, dst,
                                              4096) == -1
    assert t.s < TIMEOUT_S + SLACK_S
    with Elapsed() as t:
        assert engine.send_probe(peer.segment) == -1
        assert engine.transfer_submit_write(peer.segment, local.addr, dst,
                                            1) == 0
    assert t.s < TIMEOUT_S + SLACK_S

    # The engine still serves other peers.
    other = Peer()
    try:
        assert engine.transfer_sync_write(other.segment, local.addr,
                                          other.info["reg"], 4096) == 0
        assert other.read(other.info["reg"], 4096) == pattern(4096, 1)
    finally:
        other.close()


def test_peer_killed_with_transfers_in_flight(engine, local, peer):
    base = peer.info["reg"]
    local.put(0, pattern(4 * MiB, 2))
    assert engine.transfer_sync_write(peer.segment, local.addr, base,
                                      4096) == 0
    # Stopped first, so that the batch is certainly still in flight when
    # the kill lands.
    peer.stop()
    bid = engine.batch_transfer_async_write(
        peer.segment, [local.addr + i * MiB for i in range(4)],
        [base + i * MiB for i in range(4)], [MiB] * 4)
    assert bid != 0
    time.sleep(0.2)
    assert engine.transfer_check_status(bid) == 0
    peer.kill()
    with Elapsed() as t:
        assert engine.get_batch_transfer_status([bid]) == -1
    assert t.s < TIMEOUT_S + SLACK_S


def test_stopped_peer_sync(engine, local, peer, caplog):
    dst = peer.info["reg"]
    local.put(0, pattern(4096, 3))
    assert engine.transfer_sync_write(peer.segment, local.addr, dst,
                                      4096) == 0
    peer.stop()
    with caplog.at_level(logging.WARNING, logger="kvt"):
        with Elapsed() as t:
            assert engine.transfer_sync_write(peer.segment, local.addr, dst,
                                              4096) == -1
    # It is the timeout that ended it, not some other failure.
    assert TIMEOUT_S - 0.3 < t.s < TIMEOUT_S + SLACK_S
    assert "KVT_ERR_TIMEDOUT" in caplog.text
    with Elapsed() as t:
        assert engine.send_probe(peer.segment) == -1
    assert t.s < TIMEOUT_S + SLACK_S

    # A fresh engine, which still has to handshake, is bounded too.
    fresh = new_engine()
    flocal = Local(fresh, 4096)
    with Elapsed() as t:
        assert fresh.transfer_sync_write(peer.segment, flocal.addr, dst,
                                         4096) == -1
    assert t.s < TIMEOUT_S + SLACK_S


def test_stopped_peer_async_timeout_status(engine, local, peer):
    dst = peer.info["managed"]
    assert engine.transfer_sync_write(peer.segment, local.addr, dst, 1) == 0
    peer.stop()
    bid = engine.transfer_submit_write(peer.segment, local.addr, dst, 4096)
    assert bid != 0
    with Elapsed() as t:
        while (st := engine.transfer_check_status(bid)) == 0:
            assert time.monotonic() - t.t0 < TIMEOUT_S + SLACK_S
            time.sleep(0.01)
    assert st == -2
    # Mooncake's rule: a timed-out id is not freed by the check ...
    assert engine.transfer_check_status(bid) == -2
    # ... get_batch_transfer_status consumes it.
    assert engine.get_batch_transfer_status([bid]) == -1
    assert engine.transfer_check_status(bid) == -1


def test_stopped_peer_waits_release_the_gil(engine, local, peer):
    """While a call waits on a stopped peer, other Python threads run."""
    dst = peer.info["reg"]
    assert engine.transfer_sync_write(peer.segment, local.addr, dst, 1) == 0
    peer.stop()
    bid = engine.batch_transfer_async_write(peer.segment, [local.addr],
                                            [dst], [4096])
    results = {}

    def waiter():
        results["batch"] = engine.get_batch_transfer_status([bid])
        results["sync"] = engine.transfer_sync_write(peer.segment,
                                                     local.addr, dst, 4096)

    th = threading.Thread(target=waiter)
    spins = 0
    with Elapsed() as t:
        th.start()
        while th.is_alive():
            spins += 1
            sum(range(100))
        th.join()
    assert results == {"batch": -1, "sync": -1}
    # Two bounded waits; the main thread kept running throughout.
    assert t.s < 2 * (TIMEOUT_S + SLACK_S)
    assert spins > 1000


def test_stopped_peer_recovers_after_sigcont(engine, local, peer):
    dst = peer.info["reg"]
    assert engine.transfer_sync_write(peer.segment, local.addr, dst, 1) == 0
    peer.stop()
    assert engine.transfer_sync_write(peer.segment, local.addr, dst,
                                      4096) == -1
    import os
    import signal
    os.kill(peer.pid, signal.SIGCONT)
    peer.stopped = False
    local.put(0, pattern(4096, 4))
    # The failed session was evicted; the next call handshakes afresh.
    assert engine.transfer_sync_write(peer.segment, local.addr, dst,
                                      4096) == 0
    assert peer.read(dst, 4096) == pattern(4096, 4)
