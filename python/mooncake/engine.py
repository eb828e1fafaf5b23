# SPDX-License-Identifier: Apache-2.0
"""``mooncake.engine`` on kvt.

``from mooncake.engine import TransferEngine`` gives kvt's TransferEngine,
whose methods keep Mooncake's names, argument order, defaults and return
codes. The module-level names below are the ones Mooncake's extension
module defines for the transfer engine.
"""

from kvt import _kvt
from kvt import Read, TransferEngine, TransferNotify, TransferOpcode, Write

# Mooncake's build-time feature flags (every one its module defines), with
# kvt's answers. SUPPORT_CUDA: this kvt registers and moves CUDA device
# memory (its cuda memory domain is built; the driver is found at run time,
# see docs/cuda.md). Mooncake's stream-ordered ``*_on_cuda`` calls are not
# provided. kvt has none of the other device transports: EFA, HIP (AMD),
# MUSA (Moore Threads), multi-node NVLink, intra-node NVLink.
SUPPORT_CUDA = bool(_kvt.HAVE_CUDA)
SUPPORT_EFA = False
SUPPORT_HIP = False
SUPPORT_MNNVL = False
SUPPORT_MUSA = False
SUPPORT_INTRA_NVLINK = False

__all__ = [
    "Read",
    "SUPPORT_CUDA",
    "SUPPORT_EFA",
    "SUPPORT_HIP",
    "SUPPORT_INTRA_NVLINK",
    "SUPPORT_MNNVL",
    "SUPPORT_MUSA",
    "TransferEngine",
    "TransferNotify",
    "TransferOpcode",
    "Write",
]
