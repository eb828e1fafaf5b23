# SPDX-License-Identifier: Apache-2.0
"""Engine metrics from Python: get_metrics() after known traffic (counts
exact), get_metrics_text() parsed by prometheus_client's parser and
agreeing with it, the /metrics listener (KVT_METRICS_PORT), and the
kvt.Error hierarchy."""

import os
import subprocess
import sys
import urllib.request

import pytest

import kvt
from conftest import MiB, Local, new_engine, pattern

parser = pytest.importorskip("prometheus_client.parser")


@pytest.fixture(scope="module")
def peer(shared_peer):
    return shared_peer


def test_counts_after_known_traffic(peer):
    e = new_engine()
    local = Local(e, 4 * MiB)
    local.put(0, pattern(MiB, 1))
    dst = peer.info["reg"]
    for _ in range(5):
        assert e.transfer_sync_write(peer.segment, local.addr, dst,
                                     4096) == 0
    for _ in range(3):
        assert e.transfer_sync_read(peer.segment, local.addr, dst,
                                    65536) == 0
    # One the peer refuses: far past its registered memory.
    assert e.transfer_sync_write(peer.segment, local.addr, 1 << 60,
                                 4096) != 0
    m = e.get_metrics()
    t = m["transports"]["tcp"]
    assert t["writes"] == 5 and t["write_bytes"] == 5 * 4096
    assert t["reads"] == 3 and t["read_bytes"] == 3 * 65536
    assert sum(t["failures"].values()) == 1
    assert m["inflight"] == 0
    lat = t["latency"]
    assert lat["le_4KiB"]["count"] + lat["le_64KiB"]["count"] == 9
    assert lat["le_64KiB"]["count"] == 3
    buckets = lat["le_4KiB"]["buckets"]
    assert buckets[-1][0] == float("inf") and buckets[-1][1] == 6
    assert all(a[1] <= b[1] for a, b in zip(buckets, buckets[1:]))
    assert t["sessions_open"] >= 1 and m["segments_open"] >= 1

    # The text says the same, and parses.
    text = e.get_metrics_text()
    name = None
    fams = {f.name: f for f in parser.text_string_to_metric_families(text)}
    for s in fams["kvt_transfer_descriptors"].samples:
        if s.labels["transport"] == "tcp" and s.labels["op"] == "write":
            assert s.value == 5
            name = s.labels["engine"]
    assert name
    by = {(s.labels["transport"], s.labels["op"]): s.value
          for s in fams["kvt_transfer_bytes"].samples}
    assert by[("tcp", "write")] == 5 * 4096
    assert by[("tcp", "read")] == 3 * 65536
    hist = fams["kvt_transfer_latency_seconds"]
    assert hist.type == "histogram"
    counts = {s.labels["size"]: s.value for s in hist.samples
              if s.name == "kvt_transfer_latency_seconds_count"
              and s.labels["transport"] == "tcp"}
    assert counts["le_4KiB"] == 6 and counts["le_64KiB"] == 3
    fails = [s for s in fams["kvt_transfer_failures"].samples
             if s.labels["transport"] == "tcp"]
    assert len(fails) == 1 and fails[0].value == 1
    assert fails[0].labels["status"].startswith("KVT_ERR_")


def test_listener_in_a_fresh_process(peer):
    # KVT_METRICS_PORT starts the listener with the first engine.
    code = (
        "import kvt, sys, urllib.request\n"
        "e = kvt.TransferEngine()\n"
        "assert e.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', '') == 0\n"
        "port = kvt.metrics_port()\n"
        "body = urllib.request.urlopen(f'http://127.0.0.1:{port}/metrics',"
        " timeout=5).read().decode()\n"
        "from prometheus_client.parser import text_string_to_metric_families"
        " as parse\n"
        "names = {f.name for f in parse(body)}\n"
        "print(port, 'kvt_batches' in names and 'kvt_transfer_latency_seconds'"
        " in names)\n")
    env = dict(os.environ, KVT_METRICS_PORT="0")
    out = subprocess.run([sys.executable, "-c", code], env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    port, seen = out.stdout.split()
    assert int(port) > 0 and seen == "True"


def test_error_hierarchy():
    e = kvt.TransferEngine()
    with pytest.raises(kvt.StateError) as ei:
        e.get_metrics()
    assert isinstance(ei.value, kvt.Error)
    assert isinstance(ei.value, RuntimeError)  # as before
    for cls, builtin in ((kvt.InvalidArgumentError, ValueError),
                         (kvt.PeerError, ConnectionError),
                         (kvt.TransferTimeoutError, TimeoutError),
                         (kvt.AccessError, PermissionError),
                         (kvt.ResourceError, MemoryError),
                         (kvt.NotFoundError, LookupError)):
        assert issubclass(cls, kvt.Error) and issubclass(cls, builtin)
    for cls in (kvt.NotSupportedError, kvt.ProtocolError, kvt.CanceledError,
                kvt.BusyError):
        assert issubclass(cls, kvt.Error)


def test_target_counts_what_it_served():
    """One-sided writes and reads are counted where they land too: the
    target's get_metrics() and text show what its peer moved."""
    target = new_engine()
    tlocal = Local(target, 4 * MiB)
    seg = "127.0.0.1:%d" % target.get_rpc_port()
    e = new_engine()
    local = Local(e, 4 * MiB)
    local.put(0, pattern(MiB, 3))
    for _ in range(4):
        assert e.transfer_sync_write(seg, local.addr, tlocal.addr,
                                     MiB) == 0
    assert e.transfer_sync_read(seg, local.addr, tlocal.addr, 8192) == 0
    t = target.get_metrics()["transports"]["tcp"]
    assert t["writes"] == 0 and t["write_bytes"] == 0  # it initiated none
    assert t["served_write_bytes"] == 4 * MiB
    assert t["served_read_bytes"] == 8192 and t["served_reads"] == 1
    assert t["served_writes"] >= 4  # pieces: a descriptor may be sliced
    fams = {f.name: f for f in parser.text_string_to_metric_families(
        target.get_metrics_text())}
    by = {(s.labels["transport"], s.labels["op"]): s.value
          for s in fams["kvt_served_bytes"].samples}
    assert by[("tcp", "write")] == 4 * MiB and by[("tcp", "read")] == 8192
