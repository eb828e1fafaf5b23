# SPDX-License-Identifier: Apache-2.0
"""Parts of kvt.vllm's connector that need no vLLM instance: the room a
transfer id names, and decode's post to the proxy (its failure must fail
the room at once, not at a timeout)."""

import ctypes
import http.server
import threading

import pytest

from kvt.connector import (BlockLayout, CacheKind, DisaggregationMode,
                           KVArgs, KVBootstrapServer, KVCache, KVManager,
                           KVPoll, KVReceiver)
from kvt.vllm.connector import _Worker, room_of


def test_room_of():
    assert room_of("kvt-1") == room_of("kvt-1")
    assert room_of("kvt-1") != room_of("kvt-2")
    assert 0 <= room_of("x" * 500) < 2**63


@pytest.fixture
def receiver():
    boot = KVBootstrapServer(0, "127.0.0.1")
    buf = (ctypes.c_uint8 * (8 * 256))()
    args = KVArgs()
    args.caches = [KVCache(0, CacheKind.KV, ctypes.addressof(buf), 256, 8,
                           4, 2, 32, BlockLayout.HEAD_MAJOR)]
    args.num_layers = 1
    args.bootstrap_addr = f"127.0.0.1:{boot.port}"
    mgr = KVManager(args, DisaggregationMode.DECODE)
    rx = KVReceiver(mgr, args.bootstrap_addr, room_of("kvt-test"))
    rx.init([0, 1], prefix_blocks=0)
    yield rx
    rx.close()
    mgr.close()
    boot.close()


BODY = {"transfer_id": "kvt-test", "room": room_of("kvt-test")}


def test_unreachable_metaserver_fails_the_room(receiver):
    _Worker._post("http://127.0.0.1:1/meta", BODY, receiver, 5)
    assert receiver.wait(10) == KVPoll.Failed
    assert "metaserver http://127.0.0.1:1/meta" in receiver.reason


def test_metaserver_answering_leaves_the_room_open(receiver):
    got = []

    class Meta(http.server.BaseHTTPRequestHandler):
        def do_POST(self):
            got.append(self.rfile.read(int(self.headers["Content-Length"])))
            self.send_response(200)
            self.end_headers()

        def log_message(self, *args):
            pass

    srv = http.server.HTTPServer(("127.0.0.1", 0), Meta)
    t = threading.Thread(target=srv.handle_request, daemon=True)
    t.start()
    _Worker._post(f"http://127.0.0.1:{srv.server_port}/meta", BODY,
                  receiver, 5)
    t.join(5)
    srv.server_close()
    assert got and b"kvt-test" in got[0]
    assert receiver.poll() != KVPoll.Failed
