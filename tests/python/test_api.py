# SPDX-License-Identifier: Apache-2.0
"""The module itself: imports, Mooncake names, initialisation, local memory
and argument checking. No peer needed."""

import ctypes
import logging
import mmap
import os
import pathlib
import shutil
import subprocess
import sys

import pytest

import kvt
import mooncake.engine
from conftest import MiB, address_of, new_engine


def interpreters():
    """Every CPython >= 3.11 on this machine we can find: Debian's, the
    first python3 on PATH (pyenv here), and the one running the tests."""
    seen, found = set(), []
    for cand in ("/usr/bin/python3", shutil.which("python3"),
                 sys.executable):
        if not cand or not os.path.exists(cand):
            continue
        real = os.path.realpath(cand)
        # pyenv shims are scripts; resolve them to the interpreter.
        out = subprocess.run(
            [cand, "-c", "import sys; print(sys.executable);"
                         "print(sys.version_info >= (3, 11))"],
            capture_output=True, text=True)
        if out.returncode != 0:
            continue
        exe, ok = out.stdout.split()
        if ok != "True" or os.path.realpath(exe) in seen:
            continue
        seen.add(os.path.realpath(exe))
        seen.add(real)
        found.append(cand)
    return found


def test_abi3_module_file():
    so = pathlib.Path(kvt._kvt.__file__)
    assert so.name == "_kvt.abi3.so"


@pytest.mark.parametrize("python", interpreters())
def test_imports_in_every_interpreter(python):
    code = ("import kvt, mooncake.engine as me\n"
            "from mooncake.engine import TransferEngine\n"
            "assert TransferEngine is kvt.TransferEngine\n"
            "e = TransferEngine()\n"
            "assert e.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', '') == 0\n"
            "assert e.get_rpc_port() > 0\n"
            "print('ok')\n")
    out = subprocess.run([python, "-c", code], capture_output=True,
                         text=True, env=os.environ.copy(), timeout=60)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == "ok"


def test_mooncake_names():
    me = mooncake.engine
    assert me.TransferEngine is kvt.TransferEngine
    assert me.TransferNotify is kvt.TransferNotify
    assert me.TransferOpcode is kvt.TransferOpcode
    # pybind11's arithmetic enum: Read = 0, Write = 1, members exported
    # to the module and the enum reachable from the class.
    assert int(me.TransferOpcode.Read) == 0
    assert int(me.TransferOpcode.Write) == 1
    assert me.TransferOpcode.READ is me.TransferOpcode.Read
    assert me.TransferOpcode.WRITE is me.TransferOpcode.Write
    assert me.Read is me.TransferOpcode.Read
    assert me.Write is me.TransferOpcode.Write
    assert me.TransferEngine.TransferOpcode is me.TransferOpcode
    assert me.SUPPORT_CUDA is bool(kvt._kvt.HAVE_CUDA)  # test_frameworks
    n = me.TransferNotify("req", "done")
    assert (n.name, n.msg) == ("req", "done")
    n.msg = "changed"
    assert n.msg == "changed"
    assert (me.TransferNotify().name, me.TransferNotify().msg) == ("", "")
    # Fields that cannot be sent are refused when built, as in Mooncake.
    for bad in ((1, "m"), ("n", None), (None,)):
        with pytest.raises(TypeError, match="str or bytes"):
            me.TransferNotify(*bad)
    assert me.TransferNotify(b"n", memoryview(b"m")).name == b"n"
    assert kvt.status_str(-8).startswith("remote peer refused")
    assert kvt.status_str(-20).startswith("authentication failed")
    for name in ("initialize", "initialize_ext", "get_rpc_port",
                 "register_memory", "unregister_memory",
                 "batch_register_memory", "batch_unregister_memory",
                 "allocate_managed_buffer", "free_managed_buffer",
                 "write_bytes_to_buffer", "read_bytes_from_buffer",
                 "get_first_buffer_address", "transfer_sync_write",
                 "transfer_sync_read", "transfer_sync",
                 "batch_transfer_sync_write", "batch_transfer_sync_read",
                 "batch_transfer_sync", "batch_transfer_async_write",
                 "batch_transfer_async_read", "batch_transfer_async",
                 "transfer_submit_write", "transfer_check_status",
                 "get_batch_transfer_status", "get_notifies", "send_probe"):
        assert callable(getattr(me.TransferEngine, name)), name


def test_initialize_p2p_and_rpc_port():
    e = kvt.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    port = e.get_rpc_port()
    assert 0 < port < 65536
    # A second initialize is refused; the engine keeps working.
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == -1
    assert e.get_rpc_port() == port


def test_initialize_variants(caplog):
    # Mooncake passes device names and protocols kvt does not use; p2p
    # ignores the port of local_hostname unless legacy binding is asked.
    e = kvt.TransferEngine()
    assert e.initialize("127.0.0.1:1", "P2PHANDSHAKE", "rdma", "mlx5_0") == 0
    assert e.get_rpc_port() != 1
    e = kvt.TransferEngine()
    assert e.initialize_ext("127.0.0.1", "P2PHANDSHAKE", "tcp", "",
                            "p2p") == 0
    e = kvt.TransferEngine()
    assert e.initialize_ext("127.0.0.1", "ignored:2379", None, None,
                            "P2PHANDSHAKE") == 0


@pytest.mark.parametrize("call,uri", [
    (("initialize", ("127.0.0.1", "P2PHANDSHAKE", "tcp", "")), "p2p"),
    # Mooncake: a server without a scheme is etcd ...
    (("initialize", ("127.0.0.1", "127.0.0.1:2379", "tcp", "")),
     "etcd://127.0.0.1:2379"),
    (("initialize", ("127.0.0.1", "http://127.0.0.1:1/metadata", "tcp", "")),
     "http://127.0.0.1:1/metadata"),
    # ... or gets metadata_type as its scheme.
    (("initialize_ext", ("127.0.0.1", "127.0.0.1:6379", "tcp", "",
                         "redis")), "redis://127.0.0.1:6379"),
    (("initialize_ext", ("127.0.0.1", "etcd://h:1", "tcp", "", "redis")),
     "etcd://h:1"),
])
def test_initialize_metadata_uris(call, uri, caplog):
    """The metadata server string becomes the URI Mooncake would use. No
    server is contacted at creation, so an engine starts before its
    metadata server (see docs/metadata.md)."""
    e = kvt.TransferEngine()
    with caplog.at_level(logging.INFO, logger="kvt"):
        assert getattr(e, call[0])(*call[1]) == 0
    assert f"metadata {uri}" in caplog.text
    assert e.get_rpc_port() > 0


@pytest.mark.parametrize("bad", ["ftp://127.0.0.1:1", "http://"])
def test_initialize_bad_metadata_uri(bad, caplog):
    e = kvt.TransferEngine()
    with caplog.at_level(logging.ERROR, logger="kvt"):
        assert e.initialize("127.0.0.1", bad, "tcp", "") == -1
    assert "initialize" in caplog.text
    with pytest.raises(RuntimeError, match="not initialized"):
        e.get_rpc_port()


def test_initialize_bad_local_hostname(caplog):
    e = kvt.TransferEngine()
    with caplog.at_level(logging.ERROR, logger="kvt"):
        assert e.initialize("127.0.0.1:notaport", "P2PHANDSHAKE", "tcp",
                            "") == -1
    assert "host[:port]" in caplog.text


def test_uninitialized_engine_raises():
    e = kvt.TransferEngine()
    with pytest.raises(RuntimeError, match="initialize"):
        e.transfer_sync_write("127.0.0.1:1", 1, 1, 1)
    with pytest.raises(RuntimeError):
        e.register_memory(1, 1)
    with pytest.raises(TypeError):
        kvt.TransferEngine("127.0.0.1")


def test_register_not_host_memory(engine):
    # Addresses reserved without access, as a GPU driver reserves device
    # memory: with no driver kvt knows, a device pointer is refused at
    # registration (non-zero, as Mooncake returns for a failed
    # registration), never taken for host memory.
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mmap.restype = ctypes.c_void_p
    libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int,
                          ctypes.c_int, ctypes.c_int, ctypes.c_long]
    libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    p = libc.mmap(None, MiB, 0,  # PROT_NONE
                  mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS, -1, 0)
    assert p not in (None, ctypes.c_void_p(-1).value)
    try:
        assert engine.register_memory(p, MiB) != 0
        assert engine.register_memory(p, MiB, "cpu:0") != 0
        assert engine.batch_register_memory([p], [MiB]) != 0
    finally:
        libc.munmap(p, MiB)


def test_register_and_unregister(engine):
    bufs = [mmap.mmap(-1, 1 * MiB) for _ in range(4)]
    a = [address_of(b) for b in bufs]
    assert engine.register_memory(a[0], MiB) == 0
    # Overlap and double registration are refused (negative status).
    assert engine.register_memory(a[0], MiB) < 0
    assert engine.register_memory(a[0] + 4096, 4096, "cpu:0") < 0
    assert engine.unregister_memory(a[0]) == 0
    assert engine.unregister_memory(a[0]) < 0
    assert engine.register_memory(a[0], MiB, location="cpu:0") == 0
    assert engine.unregister_memory(a[0]) == 0
    # Zero length; host memory stated to be GPU memory; locations of
    # other accelerators.
    assert engine.register_memory(a[0], 0) < 0
    assert engine.register_memory(a[0], MiB, "cuda:0") < 0
    assert engine.register_memory(a[0], MiB, "npu:0") < 0
    assert engine.register_memory(a[0], MiB, "cuda:x") < 0
    assert engine.register_memory(a[0], MiB, "*") == 0
    assert engine.unregister_memory(a[0]) == 0
    # Batches are all or nothing.
    assert engine.batch_register_memory(a[1:], [MiB] * 3) == 0
    assert engine.batch_register_memory([a[0], a[1]], [MiB, MiB]) < 0
    assert engine.register_memory(a[0], MiB) == 0  # a[0] was left free
    assert engine.batch_unregister_memory(a[:4]) == 0
    assert engine.batch_unregister_memory([a[0]]) < 0
    assert engine.batch_register_memory([a[0]], [MiB, MiB]) < 0
    assert engine.batch_register_memory([], []) == 0
    assert engine.batch_unregister_memory([]) == 0
    # numpy-style integers work through __index__.

    class Index:
        def __init__(self, v):
            self.v = v

        def __index__(self):
            return self.v

    assert engine.register_memory(Index(a[2]), Index(MiB)) == 0
    assert engine.unregister_memory(Index(a[2])) == 0


def test_managed_buffer_and_bytes(engine):
    addr = engine.allocate_managed_buffer(3 * MiB)
    assert addr != 0 and addr % 4096 == 0
    assert engine.read_bytes_from_buffer(addr, 4096) == bytes(4096)
    payload = os.urandom(100000)
    assert engine.write_bytes_to_buffer(addr, payload, len(payload)) == 0
    assert engine.read_bytes_from_buffer(addr, len(payload)) == payload
    assert engine.write_bytes_to_buffer(addr + 7, bytearray(b"xyz"), 2) == 0
    assert engine.write_bytes_to_buffer(addr + 9, memoryview(b"Q"), 1) == 0
    assert engine.write_bytes_to_buffer(addr + 10, "é", 2) == 0
    assert engine.read_bytes_from_buffer(addr + 7, 5) == b"xyQ\xc3\xa9"
    assert engine.read_bytes_from_buffer(addr, 0) == b""
    # The managed buffer is registered: registering it again overlaps.
    assert engine.register_memory(addr, 4096) < 0
    with pytest.raises(ValueError, match="exceeds"):
        engine.write_bytes_to_buffer(addr, b"ab", 3)
    with pytest.raises(ValueError):
        engine.read_bytes_from_buffer(0, 1)
    assert engine.free_managed_buffer(addr, 3 * MiB) == 0
    assert engine.free_managed_buffer(addr, 3 * MiB) < 0
    # Length 0 gives a buffer too, as Mooncake's buddy allocator does.
    empty = engine.allocate_managed_buffer(0)
    assert empty != 0
    assert engine.write_bytes_to_buffer(empty, b"z", 1) == 0
    assert engine.free_managed_buffer(empty, 0) == 0


def test_argument_errors(engine):
    with pytest.raises(TypeError):
        engine.transfer_sync_write("127.0.0.1:1", "not an int", 0, 1)
    with pytest.raises(OverflowError):
        engine.transfer_sync_write("127.0.0.1:1", -1, 0, 1)
    with pytest.raises(TypeError):
        engine.transfer_sync_write(12, 1, 0, 1)
    with pytest.raises(TypeError, match="missing"):
        engine.transfer_sync_write("127.0.0.1:1", 1, 0)
    with pytest.raises(TypeError, match="unexpected keyword"):
        engine.transfer_sync_write("127.0.0.1:1", 1, 0, 1, bogus=1)
    with pytest.raises(ValueError, match="opcode"):
        engine.transfer_sync("127.0.0.1:1", 1, 0, 1, 7)
    with pytest.raises(TypeError):
        engine.batch_transfer_sync_write("127.0.0.1:1", 5, [0], [1])
    with pytest.raises(TypeError):
        engine.get_batch_transfer_status(3)
    # notify must be a TransferNotify (a str is not), as in Mooncake.
    for call in (engine.transfer_sync, engine.batch_transfer_sync):
        one = (1, 0, 1) if call == engine.transfer_sync else ([1], [0], [1])
        with pytest.raises(TypeError, match="TransferNotify"):
            call("127.0.0.1:1", *one, kvt.TransferOpcode.Write, "x")
    with pytest.raises(ValueError, match="too long"):
        engine.send_notify("127.0.0.1:1",
                           kvt.TransferNotify("n", "x" * 5000))
    with pytest.raises(ValueError, match="NUL"):
        engine.send_probe("127.0.0.1\0:1")


def test_unknown_batch_ids(engine, caplog):
    with caplog.at_level(logging.WARNING, logger="kvt"):
        assert engine.transfer_check_status(0) == -1
        assert engine.transfer_check_status(12345 << 32 | 7) == -1
        assert engine.get_batch_transfer_status([0]) == -1
    assert "unknown batch id" in caplog.text
    assert engine.get_batch_transfer_status([]) == 0


def test_engine_objects_are_independent():
    engines = [new_engine() for _ in range(3)]
    ports = {e.get_rpc_port() for e in engines}
    assert len(ports) == 3
    del engines
    # Destroying engines with live memory and batches is clean.
    e = new_engine()
    buf = (ctypes.c_char * 4096)()
    assert e.register_memory(ctypes.addressof(buf), 4096) == 0
    del e


def test_subclasses():
    """Both classes can be subclassed (for mocks and wrappers), and
    subclass instances are created and destroyed cleanly."""
    class Engine(kvt.TransferEngine):
        def __init__(self):
            super().__init__()
            self.calls = 0

        def transfer_sync_write(self, *args):
            self.calls += 1
            return super().transfer_sync_write(*args)

    class Notify(kvt.TransferNotify):
        pass

    e = Engine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    assert e.transfer_sync_write(f"127.0.0.1:{e.get_rpc_port()}", 1, 1,
                                 0) == 0  # zero bytes: nothing to move
    assert e.calls == 1
    n = Notify("a", "b")
    n.extra = [n]  # a reference cycle, for the collector
    assert isinstance(n, kvt.TransferNotify) and n.name == "a"
    del e, n
    import gc
    gc.collect()


# What Mooncake's wheel (mooncake-transfer-engine-non-cuda 0.3.13.post1,
# dir() of mooncake.engine and of its TransferEngine) defines, and the
# stream-ordered calls of its CUDA build; kvt serves or refuses each.
MOONCAKE_MODULE_NAMES = [
    "CoroRPCInterface", "InnerTransferEngine", "Read", "ReceivedData",
    "ReceivedTensor", "RpcInterface", "SUPPORT_CUDA", "SUPPORT_EFA",
    "SUPPORT_HIP", "SUPPORT_INTRA_NVLINK", "SUPPORT_MNNVL", "SUPPORT_MUSA",
    "SharedSegment", "TransferEngine", "TransferNotify", "TransferOpcode",
    "Write", "create_rpc_client", "create_rpc_server"]
MOONCAKE_ENGINE_METHODS = [
    "allocate_managed_buffer", "batch_register_memory",
    "batch_transfer_async", "batch_transfer_async_read",
    "batch_transfer_async_write", "batch_transfer_sync",
    "batch_transfer_sync_read", "batch_transfer_sync_write",
    "batch_unregister_memory", "free_managed_buffer",
    "get_batch_transfer_status", "get_engine", "get_engine_ptr",
    "get_first_buffer_address", "get_local_topology", "get_notifies",
    "get_rpc_port", "initialize", "initialize_ext", "read_bytes_from_buffer",
    "register_memory", "send_probe", "transfer_check_status",
    "transfer_submit_write", "transfer_sync", "transfer_sync_read",
    "transfer_sync_write", "unregister_memory", "warmup_efa_segment",
    "write_bytes_to_buffer",
    "transfer_write_on_cuda", "transfer_read_on_cuda",
    "batch_transfer_write_on_cuda", "batch_transfer_read_on_cuda"]


def test_every_mooncake_name_is_there():
    me = mooncake.engine
    assert sorted(me.__all__) == sorted(MOONCAKE_MODULE_NAMES)
    for name in MOONCAKE_MODULE_NAMES:
        assert hasattr(me, name), name
    for name in MOONCAKE_ENGINE_METHODS:
        assert callable(getattr(me.TransferEngine, name)), name


def test_refused_mooncake_names_say_why():
    me = mooncake.engine
    for cls in (me.RpcInterface, me.CoroRPCInterface, me.ReceivedData,
                me.ReceivedTensor, me.InnerTransferEngine, me.SharedSegment):
        with pytest.raises(kvt.NotSupportedError, match=cls.__name__):
            cls()
    for f in (me.create_rpc_client, me.create_rpc_server):
        with pytest.raises(kvt.NotSupportedError, match="not part of kvt"):
            f(0, 1)
    assert me.SharedSegment.supported() is False
    with pytest.raises(kvt.NotSupportedError):
        me.SharedSegment.create("x", 4096, 1, 0)
    with pytest.raises(kvt.NotSupportedError, match="get_engine_ptr"):
        me.TransferEngine().get_engine()


def test_topology_without_initialize():
    import json
    t = json.loads(mooncake.engine.TransferEngine().get_local_topology())
    assert any(k.startswith("cpu:") for k in t)
    assert all(v == [[], []] for v in t.values())


def test_on_cuda_refused_without_a_stream_to_order_on():
    """Without a CUDA driver (or, on a GPU host, with no context current
    for the NULL stream) nothing can be ordered: RuntimeError, as where
    Mooncake's cudaLaunchHostFunc fails, and nothing is queued."""
    e = mooncake.engine.TransferEngine()
    assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
    buf = ctypes.create_string_buffer(4096)
    assert e.register_memory(ctypes.addressof(buf), 4096) == 0
    me = "127.0.0.1:%d" % e.get_rpc_port()
    for call in (lambda: e.transfer_write_on_cuda(
                     me, ctypes.addressof(buf), ctypes.addressof(buf), 8),
                 lambda: e.batch_transfer_read_on_cuda(
                     me, [ctypes.addressof(buf)], [ctypes.addressof(buf)],
                     [8], 0)):
        with pytest.raises(RuntimeError, match="cannot order"):
            call()
    # Only zero-length pieces: nothing to order, no driver needed.
    assert e.transfer_write_on_cuda(me, ctypes.addressof(buf),
                                    ctypes.addressof(buf), 0) is None


def test_token_mismatch_is_authentication(monkeypatch, caplog):
    """Engines with different auth tokens: the initiator's call says
    authentication failed (KVT_ERR_AUTH), not that access to memory was
    refused; and AuthError is an AccessError (a PermissionError)."""
    monkeypatch.setenv("KVT_AUTH_TOKEN", "the-target-token")
    target = new_engine()
    monkeypatch.setenv("KVT_AUTH_TOKEN", "another-token")
    initiator = new_engine()
    name = "127.0.0.1:%d" % target.get_rpc_port()
    with caplog.at_level(logging.INFO, logger="kvt"):
        assert initiator.send_probe(name) == -1
    lines = [r.getMessage() for r in caplog.records]
    assert any("KVT_ERR_AUTH" in line for line in lines), lines
    assert not any("KVT_ERR_ACCESS" in line for line in lines), lines
    assert issubclass(kvt.AuthError, kvt.AccessError)
    assert issubclass(kvt.AuthError, PermissionError)


def test_cause_logged_before_the_call_returns(monkeypatch, caplog):
    """A failure's cause, logged by the C library on its way out, reaches
    the logger before the call returns, and before the binding's own line
    about the failure."""
    monkeypatch.setenv("KVT_METADATA_TTL", "1")  # out of 2..3600 s
    e = kvt.TransferEngine()
    with caplog.at_level(logging.INFO, logger="kvt"):
        assert e.initialize("127.0.0.1", "http://127.0.0.1:1/metadata",
                            "tcp", "") == -1
        lines = [r.getMessage() for r in caplog.records]  # no waiting
    cause = [i for i, m in enumerate(lines) if "KVT_METADATA_TTL='1'" in m]
    summary = [i for i, m in enumerate(lines) if m.startswith("initialize")]
    assert cause and summary, lines
    assert cause[0] < summary[0], lines
