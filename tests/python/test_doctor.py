# SPDX-License-Identifier: Apache-2.0
"""kvt.doctor() and `kvt doctor` on one host: a healthy pair (every
transport with its figures), authentication failures named as such, the
JSON and the exit status, the log records a framework gets, and bad
arguments refused. The faults that need another host are
tests/doctor/faults.sh (network namespaces)."""

import json
import logging
import os
import re
import subprocess

import pytest

import kvt

KVT = os.environ["KVT_BIN"]


class Serve:
    """`kvt doctor --serve` on a free port of 127.0.0.1."""

    def __init__(self, env=None):
        e = dict(os.environ)
        e.pop("KVT_AUTH_TOKEN", None)
        e.update(env or {})
        self.proc = subprocess.Popen([KVT, "doctor", "--serve"],
                                     stdout=subprocess.PIPE, text=True,
                                     env=e)
        line = self.proc.stdout.readline()
        m = re.match(r"serving (\S+) \(scratch region of (\d+) bytes", line)
        assert m, line
        self.segment = m.group(1)

    def close(self):
        self.proc.terminate()
        assert self.proc.wait(10) == 0


@pytest.fixture
def peer():
    s = Serve()
    yield s
    s.close()


def by_id(report):
    return {c["id"]: c for c in report["checks"]}


def test_healthy_pair_every_transport_measured(peer):
    r = kvt.doctor(peer=peer.segment, probe_bytes=8 << 20)
    c = by_id(r)
    assert r["ok"] is True
    for step in ("peer.resolve", "peer.control", "peer.version", "peer.auth",
                 "peer.handshake", "peer.select.host-host"):
        assert c[step]["level"] == "ok", c[step]
    # Both transports that serve a same-host peer moved verified bytes.
    for tl in ("tcp", "shm"):
        t = c["peer.transfer." + tl]
        assert t["level"] == "ok", t
        assert "verified" in t["detail"]
        assert t["mbps"] > 0 and t["lat_us"] > 0 and t["ms"] > 0
    assert c["peer.select.host-host"]["detail"].startswith(
        "host->host: shm (the highest priority of the 2 that serve it)")


def test_command_json_and_exit_status(peer):
    p = subprocess.run([KVT, "doctor", peer.segment, "--json", "--probe",
                        "1M"], capture_output=True, text=True, timeout=60)
    assert p.returncode == 0, p.stdout + p.stderr
    r = json.loads(p.stdout)
    assert r["ok"] is True and r["worst"] in ("ok", "warn")
    assert by_id(r)["peer.transfer.tcp"]["mbps"] > 0
    # A peer nobody serves: failed, said as such, exit status 1.
    p = subprocess.run([KVT, "doctor", "127.0.0.1:1", "--timeout", "1"],
                       capture_output=True, text=True, timeout=60)
    assert p.returncode == 1, p.stdout
    assert re.search(r"^FAIL +peer.control +nothing listens on "
                     r"127.0.0.1:1 \(connection refused\)", p.stdout, re.M)
    assert "fix: check that the peer runs" in p.stdout


def test_token_mismatch_and_missing_are_named():
    s = Serve({"KVT_AUTH_TOKEN": "the-peers-secret"})
    try:
        c = by_id(kvt.doctor(peer=s.segment, auth_token="another"))
        assert c["peer.auth"]["level"] == "fail"
        assert c["peer.auth"]["status"] == "KVT_ERR_AUTH"
        assert "token mismatch" in c["peer.auth"]["detail"]
        c = by_id(kvt.doctor(peer=s.segment, auth_token=""))
        assert "token missing" in c["peer.auth"]["detail"]
        c = by_id(kvt.doctor(peer=s.segment, auth_token="the-peers-secret",
                             probe_bytes=0))
        assert c["peer.auth"]["detail"] == (
            "authenticated: both sides proved the token")
        assert c["peer.transfer.tcp"]["level"] == "ok"
    finally:
        s.close()


def test_log_records_for_a_framework(peer, caplog):
    with caplog.at_level(logging.INFO, logger="kvt.doctor"):
        kvt.doctor(peer="127.0.0.1:1", timeout=1, log=True)
    recs = [r for r in caplog.records if r.name == "kvt.doctor"]
    assert any(r.levelno == logging.ERROR and
               r.getMessage().startswith("fail peer.control: nothing listens")
               and "(fix: " in r.getMessage() for r in recs)
    assert any(r.levelno == logging.INFO and
               r.getMessage().startswith("ok host.kvt: ") for r in recs)


def test_no_scratch_region_no_writes():
    """A peer that exposes no scratch region is read, never written."""
    e = kvt.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = e.allocate_managed_buffer(1 << 20)
    assert buf != 0
    e.write_bytes_to_buffer(buf, b"\xa5" * 4096, 4096)
    seg = "127.0.0.1:%d" % e.get_rpc_port()
    c = by_id(kvt.doctor(peer=seg, transports="tcp"))
    assert c["peer.transfer.tcp"]["level"] == "skip"
    assert "exposes no scratch region" in c["peer.transfer.tcp"]["detail"]
    assert e.read_bytes_from_buffer(buf, 4096) == b"\xa5" * 4096


def test_bad_arguments():
    with pytest.raises(ValueError):
        kvt.doctor(transports="tcp,bogus")
    with pytest.raises(ValueError):
        kvt.doctor(mem="gpu")
    with pytest.raises(ValueError):
        kvt.doctor(timeout=0)
    p = subprocess.run([KVT, "doctor", "--transports", "bogus"],
                       capture_output=True, text=True)
    assert p.returncode == 2 and "bad --transports" in p.stderr
    p = subprocess.run([KVT, "doctor", "--help"], capture_output=True,
                       text=True)
    assert p.returncode == 0 and p.stdout.startswith("usage: kvt doctor")
