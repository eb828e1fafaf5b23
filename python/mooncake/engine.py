# SPDX-License-Identifier: Apache-2.0
"""``mooncake.engine`` on kvt.

``from mooncake.engine import TransferEngine`` gives kvt's TransferEngine,
whose methods keep Mooncake's names, argument order, defaults and return
codes. The module-level names below are the ones Mooncake's extension
module defines (read from its wheel), each served by kvt or refused with
kvt.NotSupportedError saying why (docs/integration.md lists them).
"""

from kvt import _kvt
from kvt import NotSupportedError
from kvt import Read, TransferEngine, TransferNotify, TransferOpcode, Write

# Mooncake's build-time feature flags (every one its module defines), with
# kvt's answers. SUPPORT_CUDA: this kvt registers and moves CUDA device
# memory (its cuda memory domain is built; the driver is found at run time,
# see docs/cuda.md), and serves the stream-ordered ``*_on_cuda`` calls.
# kvt has none of the other device transports: EFA, HIP (AMD), MUSA (Moore
# Threads), multi-node NVLink, intra-node NVLink.
SUPPORT_CUDA = bool(_kvt.HAVE_CUDA)
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_MUSA = False
SUPPORT_INTRA_NVLINK = False

_RPC = ("Mooncake's tensor RPC between ranks (its collective and expert-"
        "parallel libraries' channel) is not part of kvt; move tensors with "
        "TransferEngine's one-sided transfers and notifications")


def _refuse(what, why):
    raise NotSupportedError(f"mooncake.engine.{what}: {why}")


class _Refused:
    """A Mooncake type kvt does not provide: it cannot be made."""

    _why = ""

    def __init__(self, *args, **kwargs):
        _refuse(type(self).__name__, self._why)


class RpcInterface(_Refused):
    _why = _RPC


class CoroRPCInterface(_Refused):
    _why = _RPC


class ReceivedData(_Refused):
    _why = _RPC


class ReceivedTensor(_Refused):
    _why = _RPC


class InnerTransferEngine(_Refused):
    _why = ("Mooncake's C++ engine object; kvt's engine is reached through "
            "TransferEngine.get_engine_ptr() (a kvt_engine_h)")


class SharedSegment(_Refused):
    """Mooncake's memory shared by the ranks of one host (its collective
    library's); kvt shares memory between processes through its shm
    transport instead, per transfer."""

    _why = ("Mooncake's rank-shared memory segment is not part of kvt "
            "(SharedSegment.supported() is False)")

    @staticmethod
    def supported(mmap=True, host_register=False):
        return False

    @staticmethod
    def create(name, size, world_size, rank_id, owner_rank=0, device_id=0,
               mmap=True, host_register=False):
        _refuse("SharedSegment.create", SharedSegment._why)


def create_rpc_client(local_rank=0, world_size=1):
    _refuse("create_rpc_client", _RPC)


def create_rpc_server(local_rank=0, world_size=1):
    _refuse("create_rpc_server", _RPC)


__all__ = [
    "CoroRPCInterface",
    "InnerTransferEngine",
    "Read",
    "ReceivedData",
    "ReceivedTensor",
    "RpcInterface",
    "SUPPORT_CUDA",
    "SUPPORT_EFA",
    "SUPPORT_HIP",
    "SUPPORT_INTRA_NVLINK",
    "SUPPORT_MNNVL",
    "SUPPORT_MUSA",
    "SharedSegment",
    "TransferEngine",
    "TransferNotify",
    "TransferOpcode",
    "Write",
    "create_rpc_client",
    "create_rpc_server",
]
