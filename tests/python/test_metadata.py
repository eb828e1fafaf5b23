# SPDX-License-Identifier: Apache-2.0
"""Mooncake deployments with a metadata server: both engines initialize
with Mooncake's HTTP metadata URI served by `kvt metad`, publish their
segments there, and find each other by name."""

import logging
import os
import re
import socket
import subprocess

import pytest

from conftest import (REPO, TIMEOUT_S, Elapsed, Local, Peer, new_engine,
                      pattern)

KVT_BIN = os.environ.get("KVT_BIN", str(REPO / "build" / "bin" / "kvt"))


@pytest.fixture(scope="module")
def metad():
    if not os.access(KVT_BIN, os.X_OK):
        pytest.skip(f"{KVT_BIN} not built")
    proc = subprocess.Popen([KVT_BIN, "metad", "--port", "0", "--host",
                             "127.0.0.1"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True)
    line = proc.stdout.readline()
    m = re.search(r"listening on (http://\S+)", line)
    if not m:
        proc.kill()
        proc.wait(10)
        pytest.skip(f"kvt metad did not start: {line!r}")
    yield m.group(1) + "/metadata"
    proc.terminate()
    proc.wait(10)
    proc.stdout.close()


@pytest.fixture(scope="module")
def http_peer(metad):
    p = Peer(metadata=metad)
    yield p
    p.close()


def test_transfers_through_http_metadata(metad, http_peer):
    engine = new_engine(metadata=metad)
    local = Local(engine, 1 << 20)
    data = pattern(100000, 1)
    local.put(0, data)
    dst = http_peer.info["reg"] + 17
    assert engine.transfer_sync_write(http_peer.segment, local.addr, dst,
                                      len(data)) == 0
    assert http_peer.read(dst, len(data)) == data
    src = http_peer.info["managed"]
    http_peer.fill(src, pattern(5000, 2))
    assert engine.transfer_sync_read(http_peer.segment, local.addr + 4096,
                                     src, 5000) == 0
    assert local.get(4096, 5000) == pattern(5000, 2)
    lowest = min([http_peer.info["managed"], http_peer.info["reg"]] +
                 http_peer.info["batch"])
    assert engine.get_first_buffer_address(http_peer.segment) == lowest
    assert engine.send_probe(http_peer.segment) == 0


def test_mooncake_style_initialize_ext(metad, http_peer):
    # Mooncake splits "http" from "host:port/path" in initialize_ext.
    server = metad.split("://", 1)[1]
    from mooncake.engine import TransferEngine
    engine = TransferEngine()
    assert engine.initialize_ext("127.0.0.1", server, "tcp", "", "http") == 0
    local = Local(engine, 4096)
    local.put(0, pattern(4096, 3))
    assert engine.batch_transfer_sync_write(
        http_peer.segment, [local.addr], [http_peer.info["reg"]],
        [4096]) == 0
    assert http_peer.read(http_peer.info["reg"], 4096) == pattern(4096, 3)


def test_unknown_segment_name(metad, caplog):
    engine = new_engine(metadata=metad)
    local = Local(engine, 4096)
    with caplog.at_level(logging.WARNING, logger="kvt"):
        assert engine.transfer_sync_write("127.0.0.1:1", local.addr, 0,
                                          1) == -1
    assert "cannot open segment" in caplog.text
    assert engine.send_probe("127.0.0.1:1") == -1


def test_metadata_server_down():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    # Creation does not need the server; lookups fail within the timeout.
    engine = new_engine(metadata=f"http://127.0.0.1:{port}/metadata")
    local = Local(engine, 4096)
    with Elapsed() as t:
        assert engine.transfer_sync_write("127.0.0.1:2", local.addr, 0,
                                          1) == -1
    assert t.s < TIMEOUT_S + 1.0


def test_address_without_scheme_says_what_it_was_taken_for(metad, caplog):
    """Mooncake takes a metadata address without a scheme for etcd's. Given
    kvt metad's host:port that way, the failure names the cause and the
    fix, not an empty "answered 404"."""
    from mooncake.engine import TransferEngine
    server = metad.split("://", 1)[1].split("/", 1)[0]
    engine = TransferEngine()
    with caplog.at_level(logging.WARNING, logger="kvt"):
        # The engine starts (publishing is retried in the background).
        engine.initialize("127.0.0.1", server, "tcp", "")
    assert "lease grant answered 404: the server is not" in caplog.text
    assert "not an etcd v3 gateway" in caplog.text
    assert "write http://HOST:PORT/metadata" in caplog.text
