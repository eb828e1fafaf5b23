# SPDX-License-Identifier: Apache-2.0
"""kvt.connector: SGLang's disaggregation interface over kvt's C connector.

The bootstrap server runs in this process (KVBootstrapServer); every
prefill and decode rank is a conn_peer.py process that checks its own
outcome (decode verifies every byte) and exits 0 when it matches.
"""

import ctypes
import pathlib
import subprocess
import sys
import time

import pytest

from kvt import connector as kc
from kvt.connector import (DisaggregationMode, KVArgs, KVBootstrapServer,
                           KVCache, KVManager, KVPoll, KVReceiver)

PEER = pathlib.Path(__file__).resolve().parent / "conn_peer.py"


@pytest.fixture
def boot():
    server = KVBootstrapServer(0, "127.0.0.1")
    yield f"127.0.0.1:{server.port}"
    server.close()


def run_ranks(boot, prefill_tp, decode_tp, mode, rooms=3, extra=()):
    procs = []
    for role, tp in (("prefill", prefill_tp), ("decode", decode_tp)):
        for rank in range(tp):
            procs.append(subprocess.Popen(
                [sys.executable, str(PEER), role, str(rank), str(tp), boot,
                 mode, str(rooms), *extra],
                stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True))
    try:
        # Every rank reports once its rooms are final; then all may go.
        for p in procs:
            assert p.stdout.readline().strip() == "ready"
        for p in procs:
            p.stdin.close()
        codes = [p.wait(timeout=30) for p in procs]
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()
    assert codes == [0] * len(procs)


def test_kvpoll_values():
    assert (KVPoll.Failed, KVPoll.Bootstrapping, KVPoll.WaitingForInput,
            KVPoll.Transferring, KVPoll.Success) == (0, 1, 2, 3, 4)
    for name in ("KVArgs", "KVManager", "KVSender", "KVReceiver",
                 "KVBootstrapServer", "KVPoll"):
        assert hasattr(kc, name)


def one_cache_args(**kw):
    buf = (ctypes.c_uint8 * 4096)()
    args = KVArgs()
    args.caches = [KVCache(0, kc.CacheKind.K, ctypes.addressof(buf), 256, 16,
                           4, 4, 16),
                   KVCache(0, kc.CacheKind.V, ctypes.addressof(buf) + 4096,
                           256, 16, 4, 4, 16)]
    args.num_layers = 1
    for k, v in kw.items():
        setattr(args, k, v)
    return args, buf


def test_invalid_layout_names_the_fault():
    args, _buf = one_cache_args()
    args.caches = args.caches[:1]  # K without V
    with pytest.raises(ValueError, match="K without V"):
        KVManager(args, DisaggregationMode.DECODE)


def test_sglang_style_kvargs(boot):
    """kv_data_ptrs as K of every layer then V of every layer."""
    bufs = [(ctypes.c_uint8 * 1024)() for _ in range(4)]
    args = KVArgs()
    args.kv_data_ptrs = [ctypes.addressof(b) for b in bufs]
    args.kv_data_lens = [1024] * 4
    args.kv_item_lens = [64] * 4
    args.page_size = 4
    args.bootstrap_addr = boot
    mgr = KVManager(args, DisaggregationMode.DECODE)
    assert ":" in mgr.get_session_id()
    mgr.close()


def test_bootstrap_unreachable():
    args, _buf = one_cache_args(bootstrap_addr="127.0.0.1:1",
                                bootstrap_timeout_ms=800)
    with pytest.raises(ConnectionError):
        KVManager(args, DisaggregationMode.PREFILL)
    mgr = KVManager(args, DisaggregationMode.DECODE)
    r = KVReceiver(mgr, None, 7)
    t0 = time.monotonic()
    assert r.wait(10) == KVPoll.Failed
    assert time.monotonic() - t0 < 5
    with pytest.raises(kc.KVTransferError, match="unreachable"):
        r.failure_exception()
    r.close()
    mgr.close()


def test_whole_tp11(boot):
    run_ranks(boot, 1, 1, "whole")


def test_layerwise_tp21(boot):
    run_ranks(boot, 2, 1, "layer")


def test_layerwise_tp12(boot):
    run_ranks(boot, 1, 2, "layer")


def test_mla_dummy_tp21(boot):
    run_ranks(boot, 2, 1, "whole", extra=("--mla",))


def test_kv_kind_layerwise_tp21(boot):
    """One KV cache per layer, head-major (vLLM's CPU blocks), each of
    two prefill ranks writing its heads into one decode rank's."""
    run_ranks(boot, 2, 1, "layer", extra=("--kv",))


def test_kv_kind_tp12_over_tcp(boot):
    """The same split the other way, with the engines on tcp only
    (KVArgs.transports)."""
    run_ranks(boot, 1, 2, "layer", extra=("--kv", "--tcp"))


def test_unknown_transport_is_refused():
    args, _buf = one_cache_args(transports="tcp,carrier-pigeon")
    with pytest.raises(ValueError, match="unknown transport 'carrier-pigeon'"):
        KVManager(args, DisaggregationMode.DECODE)


def test_abort_reaches_prefill(boot):
    run_ranks(boot, 1, 1, "whole", extra=("--abort",))
