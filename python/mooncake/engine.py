# SPDX-License-Identifier: Apache-2.0
"""``mooncake.engine`` on kvt.

``from mooncake.engine import TransferEngine`` gives kvt's TransferEngine,
whose methods keep Mooncake's names, argument order, defaults and return
codes. The module-level names below are the ones Mooncake's extension
module defines for the transfer engine.
"""

from kvt import Read, TransferEngine, TransferNotify, TransferOpcode, Write

# Mooncake's build-time feature flags. kvt's transports are tcp and shm;
# none of these device transports exists in kvt.
SUPPORT_CUDA = False
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_INTRA_NVLINK = False

__all__ = [
    "Read",
    "SUPPORT_CUDA",
    "SUPPORT_EFA",
    "SUPPORT_HIP",
    "SUPPORT_INTRA_NVLINK",
    "SUPPORT_MNNVL",
    "TransferEngine",
    "TransferNotify",
    "TransferOpcode",
    "Write",
]
