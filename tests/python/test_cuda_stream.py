# SPDX-License-Identifier: Apache-2.0
"""Mooncake's stream-ordered calls (transfer_write_on_cuda,
transfer_read_on_cuda and their batch forms) against the CUDA driver test
double (tests/cuda/cuda_double.c): the double runs a stream's copies and
host functions in order on a thread of that stream, each copy after a
delay, so a transfer that did not wait for the copy queued before it, or
a copy queued after it that did not wait for the transfer, sees the wrong
bytes. The double is both the test's driver (ctypes) and kvt's
(KVT_CUDA_LIBRARY): one instance in the process.
"""
import ctypes
import os
import threading

import pytest

DOUBLE = os.environ.get("KVT_TEST_CUDA_DOUBLE")
if not DOUBLE:
    pytest.skip("KVT_TEST_CUDA_DOUBLE is not set (a build without CUDA)",
                allow_module_level=True)
# Before the first engine loads a driver.
os.environ["KVT_CUDA_LIBRARY"] = DOUBLE
os.environ.setdefault("KVT_CUDA_DOUBLE_DELAY_US", "2000")

import kvt  # noqa: E402
from mooncake.engine import TransferEngine  # noqa: E402

LEN = 1 << 20


class Cuda:
    """The few driver calls the test makes itself."""

    def __init__(self):
        self.lib = ctypes.CDLL(DOUBLE)
        u64 = ctypes.c_uint64
        self.lib.cuMemcpyAsync.argtypes = [u64, u64, ctypes.c_size_t,
                                           ctypes.c_void_p]
        assert self.lib.cuInit(0) == 0
        ctx = ctypes.c_void_p()
        assert self.lib.cuDevicePrimaryCtxRetain(ctypes.byref(ctx), 0) == 0
        assert self.lib.cuCtxSetCurrent(ctx) == 0

    def alloc(self, n):
        p = ctypes.c_uint64()
        assert self.lib.cuMemAlloc_v2(ctypes.byref(p), ctypes.c_size_t(n)) == 0
        return p.value

    def stream(self):
        s = ctypes.c_void_p()
        assert self.lib.cuStreamCreate(ctypes.byref(s), 1) == 0  # non-blocking
        return s.value

    def copy(self, dst, src, n, stream):
        assert self.lib.cuMemcpyAsync(dst, src, n, stream) == 0

    def sync(self, stream):
        assert self.lib.cuStreamSynchronize(ctypes.c_void_p(stream)) == 0

    def refusals(self):
        return self.lib.kvt_cuda_double_host_fn_refusals()


@pytest.fixture(scope="module")
def cuda():
    return Cuda()


def pattern(seed, n=LEN):
    return bytes((i * 131 + seed * 17 + (i >> 9)) & 0xFF for i in range(n))


@pytest.fixture
def pair(cuda):
    """An initiator with LEN bytes of device memory, a target with LEN of
    host memory, both over tcp on loopback."""
    ini, tgt = TransferEngine(), TransferEngine()
    assert ini.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert tgt.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    dev = cuda.alloc(LEN)
    assert ini.register_memory(dev, LEN, "cuda:0") == 0
    host = ctypes.create_string_buffer(LEN)
    remote = ctypes.addressof(host)
    assert tgt.register_memory(remote, LEN) == 0
    name = "127.0.0.1:%d" % tgt.get_rpc_port()
    yield ini, name, dev, host, remote
    del ini, tgt


def test_write_after_earlier_work_and_before_later(cuda, pair):
    ini, name, dev, host, remote = pair
    p1, p2 = ctypes.create_string_buffer(pattern(1), LEN), \
        ctypes.create_string_buffer(pattern(2), LEN)
    refused = cuda.refusals()
    s = cuda.stream()
    cuda.copy(dev, ctypes.addressof(p1), LEN, s)
    assert ini.transfer_write_on_cuda(name, dev, remote, LEN, s) is None
    cuda.copy(dev, ctypes.addressof(p2), LEN, s)
    cuda.sync(s)
    assert host.raw == p1.raw
    assert cuda.refusals() == refused  # kvt made no call from the host fn


def test_read_before_later_work(cuda, pair):
    ini, name, dev, host, remote = pair
    ctypes.memmove(host, pattern(3), LEN)
    out = ctypes.create_string_buffer(LEN)
    s = cuda.stream()
    ini.transfer_read_on_cuda(name, dev, remote, LEN, stream_ptr=s)
    cuda.copy(ctypes.addressof(out), dev, LEN, s)
    cuda.sync(s)
    assert out.raw == host.raw


def test_batch_forms(cuda, pair):
    ini, name, dev, host, remote = pair
    p = ctypes.create_string_buffer(pattern(4), LEN)
    s = cuda.stream()
    cuda.copy(dev, ctypes.addressof(p), LEN, s)
    # The halves swapped at the target, and an empty piece (moves nothing).
    half = LEN // 2
    ini.batch_transfer_write_on_cuda(name, [dev, dev + half, dev],
                                     [remote + half, remote, remote],
                                     [half, half, 0], s)
    cuda.sync(s)
    assert host.raw == p.raw[half:] + p.raw[:half]
    out = ctypes.create_string_buffer(LEN)
    ini.batch_transfer_read_on_cuda(name, [dev + half, dev],
                                    [remote, remote + half], [half, half],
                                    stream_ptr=s, transport_hint="")
    cuda.copy(ctypes.addressof(out), dev, LEN, s)
    cuda.sync(s)
    assert out.raw == p.raw


def test_failure_raised_by_the_next_call(cuda, pair):
    """A transfer that fails once the stream reaches it cannot raise; the
    stream goes on, and the engine's next such call raises why."""
    ini, name, dev, host, remote = pair
    s = cuda.stream()
    # Past the target's registered memory: the target refuses the range.
    ini.transfer_write_on_cuda(name, dev, remote + LEN, 4096, s)
    cuda.sync(s)
    with pytest.raises(kvt.AccessError, match="earlier transfer"):
        ini.transfer_write_on_cuda(name, dev, remote, 4096, s)
    # Raised once: the next call goes through.
    ini.transfer_write_on_cuda(name, dev, remote, 4096, s)
    cuda.sync(s)


def test_refusals(cuda, pair):
    ini, name, dev, host, remote = pair
    with pytest.raises(RuntimeError, match="different size"):
        ini.batch_transfer_write_on_cuda(name, [dev], [remote, remote],
                                         [8], 0)
    with pytest.raises(RuntimeError, match="open segment"):
        ini.transfer_write_on_cuda("127.0.0.1:1", dev, remote, 8)
    with pytest.raises(TypeError):
        ini.transfer_write_on_cuda(name, dev, remote, 8, "stream")
    with pytest.raises(TypeError):
        ini.transfer_write_on_cuda(name, dev, remote, 8, 0, 5)
    with pytest.raises(kvt.StateError):
        TransferEngine().transfer_read_on_cuda(name, dev, remote, 8)


def test_engine_dropped_with_work_queued(cuda):
    """The engine object goes while its transfer is still queued behind
    earlier work on the stream: the stream still completes, nothing
    crashes, and the transfer is cancelled rather than run."""
    ini, tgt = TransferEngine(), TransferEngine()
    assert ini.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert tgt.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    dev = cuda.alloc(LEN)
    assert ini.register_memory(dev, LEN) == 0
    host = ctypes.create_string_buffer(LEN)
    assert tgt.register_memory(ctypes.addressof(host), LEN) == 0
    p = ctypes.create_string_buffer(pattern(5), LEN)
    s = cuda.stream()
    cuda.copy(dev, ctypes.addressof(p), LEN, s)
    # A gate ahead of the transfer: the stream waits there until opened.
    opened = threading.Event()
    gate = ctypes.CFUNCTYPE(None, ctypes.c_void_p)(lambda _: opened.wait())
    assert cuda.lib.cuLaunchHostFunc(ctypes.c_void_p(s), gate, None) == 0
    ini.transfer_write_on_cuda("127.0.0.1:%d" % tgt.get_rpc_port(), dev,
                               ctypes.addressof(host), LEN, s)
    del ini
    opened.set()
    cuda.sync(s)
    assert host.raw == bytes(LEN)


def test_topology_and_engine_ptr(cuda):
    e = TransferEngine()
    topo = e.get_local_topology()
    import json
    t = json.loads(topo)
    assert "cuda:0" in t and "cuda:1" in t  # the double's two devices
    assert all(v == [[], []] for v in t.values())
    assert any(k.startswith("cpu:") for k in t)
    assert e.get_engine_ptr() == 0
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert e.get_engine_ptr() != 0
