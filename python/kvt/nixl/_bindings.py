# SPDX-License-Identifier: Apache-2.0
"""The types of NIXL's ``nixl._bindings`` as kvt serves them.

Descriptor lists keep their descriptors in one N x 3 ``numpy.uint64``
array (address, length, device), so that lists of millions of blocks are
built, indexed and turned into transfers without a Python loop per
descriptor. They pickle (NIXL's examples send pickled lists in
notifications).
"""

from __future__ import annotations

import enum

import numpy as np

DEFAULT_COMM_PORT = 8888
NIXL_INIT_AGENT = ""
HAVE_UCX_GPU_DEVICE_API = False


class nixl_mem_t(enum.IntEnum):
    DRAM_SEG = 0
    VRAM_SEG = 1
    BLK_SEG = 2
    OBJ_SEG = 3
    FILE_SEG = 4


DRAM_SEG = nixl_mem_t.DRAM_SEG
VRAM_SEG = nixl_mem_t.VRAM_SEG
BLK_SEG = nixl_mem_t.BLK_SEG
OBJ_SEG = nixl_mem_t.OBJ_SEG
FILE_SEG = nixl_mem_t.FILE_SEG


class nixl_xfer_op_t(enum.IntEnum):
    NIXL_READ = 0
    NIXL_WRITE = 1


NIXL_READ = nixl_xfer_op_t.NIXL_READ
NIXL_WRITE = nixl_xfer_op_t.NIXL_WRITE


class nixl_status_t(enum.IntEnum):
    NIXL_IN_PROG = 1
    NIXL_SUCCESS = 0
    NIXL_ERR_NOT_POSTED = -1
    NIXL_ERR_INVALID_PARAM = -2
    NIXL_ERR_BACKEND = -3
    NIXL_ERR_NOT_FOUND = -4
    NIXL_ERR_MISMATCH = -5
    NIXL_ERR_NOT_ALLOWED = -6
    NIXL_ERR_REPOST_ACTIVE = -7
    NIXL_ERR_UNKNOWN = -8
    NIXL_ERR_NOT_SUPPORTED = -9
    NIXL_ERR_REMOTE_DISCONNECT = -10
    NIXL_ERR_CANCELED = -11
    NIXL_ERR_NO_TELEMETRY = -12


NIXL_IN_PROG = nixl_status_t.NIXL_IN_PROG
NIXL_SUCCESS = nixl_status_t.NIXL_SUCCESS
NIXL_ERR_NOT_POSTED = nixl_status_t.NIXL_ERR_NOT_POSTED
NIXL_ERR_INVALID_PARAM = nixl_status_t.NIXL_ERR_INVALID_PARAM
NIXL_ERR_BACKEND = nixl_status_t.NIXL_ERR_BACKEND
NIXL_ERR_NOT_FOUND = nixl_status_t.NIXL_ERR_NOT_FOUND
NIXL_ERR_MISMATCH = nixl_status_t.NIXL_ERR_MISMATCH
NIXL_ERR_NOT_ALLOWED = nixl_status_t.NIXL_ERR_NOT_ALLOWED
NIXL_ERR_REPOST_ACTIVE = nixl_status_t.NIXL_ERR_REPOST_ACTIVE
NIXL_ERR_UNKNOWN = nixl_status_t.NIXL_ERR_UNKNOWN
NIXL_ERR_NOT_SUPPORTED = nixl_status_t.NIXL_ERR_NOT_SUPPORTED


class nixl_thread_sync_t(enum.IntEnum):
    NIXL_THREAD_SYNC_NONE = 0
    NIXL_THREAD_SYNC_STRICT = 1
    NIXL_THREAD_SYNC_RW = 2
    NIXL_THREAD_SYNC_DEFAULT = 3


NIXL_THREAD_SYNC_NONE = nixl_thread_sync_t.NIXL_THREAD_SYNC_NONE
NIXL_THREAD_SYNC_STRICT = nixl_thread_sync_t.NIXL_THREAD_SYNC_STRICT
NIXL_THREAD_SYNC_RW = nixl_thread_sync_t.NIXL_THREAD_SYNC_RW
NIXL_THREAD_SYNC_DEFAULT = nixl_thread_sync_t.NIXL_THREAD_SYNC_DEFAULT


# ---- Exceptions: one per NIXL error status, as NIXL raises them ----------


class nixlNotPostedError(Exception):
    pass


class nixlInvalidParamError(Exception):
    pass


class nixlBackendError(Exception):
    pass


class nixlNotFoundError(Exception):
    pass


class nixlMismatchError(Exception):
    pass


class nixlNotAllowedError(Exception):
    pass


class nixlRepostActiveError(Exception):
    pass


class nixlUnknownError(Exception):
    pass


class nixlNotSupportedError(Exception):
    pass


class nixlRemoteDisconnectError(Exception):
    pass


class nixlCancelledError(Exception):
    pass


class nixlNoTelemetryError(Exception):
    pass


# ---- Telemetry ------------------------------------------------------------


class nixlXferTelemetry:
    """Per-transfer figures: times in microseconds (startTime on the
    steady clock, CLOCK_MONOTONIC, as NIXL's), totalBytes moved and
    descCount after merging."""

    __slots__ = ("startTime", "postDuration", "xferDuration", "totalBytes",
                 "descCount")

    def __init__(self, startTime=0, postDuration=0, xferDuration=0,
                 totalBytes=0, descCount=0):
        self.startTime = startTime
        self.postDuration = postDuration
        self.xferDuration = xferDuration
        self.totalBytes = totalBytes
        self.descCount = descCount

    def __repr__(self):
        return ("nixlXferTelemetry(startTime=%d, postDuration=%d, "
                "xferDuration=%d, totalBytes=%d, descCount=%d)" %
                (self.startTime, self.postDuration, self.xferDuration,
                 self.totalBytes, self.descCount))


# ---- Descriptor lists -------------------------------------------------------


def _rows(descs, width):
    """An N x 3 uint64 array from a list of tuples of @width (the first
    three fields taken) or an N x 3 array; ValueError otherwise."""
    if isinstance(descs, np.ndarray):
        if descs.ndim != 2 or descs.shape[1] != 3:
            raise ValueError("an N x 3 array is needed")
        return np.ascontiguousarray(descs, dtype=np.uint64)
    descs = list(descs)
    for d in descs:
        if not isinstance(d, tuple) or len(d) != width:
            raise ValueError("%d-tuples are needed" % width)
    if not descs:
        return np.zeros((0, 3), dtype=np.uint64)
    return np.array([d[:3] for d in descs], dtype=np.uint64).reshape(-1, 3)


class _DList:
    """Common part of the descriptor lists: the memory type and rows."""

    _width = 3

    def __init__(self, mem_type, descs=(), *args):
        self._mem = nixl_mem_t(int(mem_type))
        self._rows = _rows(descs, self._width)

    def getType(self):
        return self._mem

    def descCount(self):
        return int(self._rows.shape[0])

    def __len__(self):
        return self.descCount()

    def isEmpty(self):
        return self._rows.shape[0] == 0

    def clear(self):
        self._rows = np.zeros((0, 3), dtype=np.uint64)

    def trim(self):
        pass

    def remDesc(self, index):
        self._rows = np.delete(self._rows, int(index), axis=0)

    def print(self):
        print(repr(self))

    def __eq__(self, other):
        return (type(other) is type(self) and self._mem == other._mem and
                np.array_equal(self._rows, other._rows) and
                self._extra() == other._extra())

    def __hash__(self):
        return hash((type(self).__name__, int(self._mem),
                     self._rows.tobytes()))

    def _extra(self):
        return None

    def __repr__(self):
        return "%s(%s, %d descriptors)" % (type(self).__name__,
                                           self._mem.name,
                                           self.descCount())


class nixlXferDList(_DList):
    """Transfer descriptors: (address, length, device) rows."""

    def __getitem__(self, i):
        r = self._rows[i]
        return (int(r[0]), int(r[1]), int(r[2]))

    def index(self, desc):
        hits = np.flatnonzero((self._rows == np.array(desc[:3], dtype=np.uint64))
                              .all(axis=1))
        if hits.size == 0:
            raise nixlNotFoundError("descriptor not in the list")
        return int(hits[0])

    def addDesc(self, desc):
        self._rows = np.vstack([self._rows,
                                np.array([desc[:3]], dtype=np.uint64)])

    append = addDesc


class nixlRegDList(_DList):
    """Registration descriptors: (address, length, device, meta) rows."""

    _width = 4

    def __init__(self, mem_type, descs=(), *args):
        if isinstance(descs, np.ndarray):
            super().__init__(mem_type, descs)
            self._meta = [b""] * self.descCount()
            return
        descs = list(descs)
        super().__init__(mem_type, descs)
        self._meta = [_as_bytes(d[3]) for d in descs]

    def __getitem__(self, i):
        r = self._rows[i]
        return (int(r[0]), int(r[1]), int(r[2]), self._meta[i])

    def index(self, desc):
        for i in range(self.descCount()):
            if self[i][:3] == tuple(desc[:3]):
                return i
        raise nixlNotFoundError("descriptor not in the list")

    def addDesc(self, desc):
        self._rows = np.vstack([self._rows,
                                np.array([desc[:3]], dtype=np.uint64)])
        self._meta.append(_as_bytes(desc[3]))

    append = addDesc

    def remDesc(self, index):
        super().remDesc(index)
        del self._meta[int(index)]

    def _extra(self):
        return self._meta

    def clear(self):
        super().clear()
        self._meta = []


class nixlRemoteDList(_DList):
    """(address, length, device, remote agent) rows."""

    _width = 4

    def __init__(self, mem_type, descs=(), *args):
        descs = list(descs)
        super().__init__(mem_type, descs)
        self._agents = [str(d[3]) for d in descs]

    def __getitem__(self, i):
        r = self._rows[i]
        return (int(r[0]), int(r[1]), int(r[2]), self._agents[i])

    def _extra(self):
        return self._agents


def _as_bytes(v):
    if isinstance(v, bytes):
        return v
    if isinstance(v, str):
        return v.encode()
    return bytes(v)
