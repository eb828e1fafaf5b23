# SPDX-License-Identifier: Apache-2.0
"""kvt's implementation of NIXL's Python agent API (``nixl._api``).

``nixl_agent`` keeps the method names, arguments, return values and
exceptions of NIXL's agent; underneath, every agent is one kvt engine
(``kvt.TransferEngine``), its transfers kvt batches and its notifications
kvt notifications. docs/nixl.md maps every call and says where kvt
differs.
"""

from __future__ import annotations

import itertools
import logging
import os
import pickle
import socket
import struct
import sys
import threading
import time
import weakref
from typing import Optional

import numpy as np

import kvt
from kvt._kvt import NOTIFY_MAX

from . import _bindings as nixlBind
from . import _meta
from ._bindings import (
    DEFAULT_COMM_PORT,
    nixlBackendError,
    nixlCancelledError,
    nixlInvalidParamError,
    nixlNoTelemetryError,
    nixlNotAllowedError,
    nixlNotFoundError,
    nixlNotSupportedError,
    nixlRegDList,
    nixlRemoteDisconnectError,
    nixlRepostActiveError,
    nixlXferDList,
    nixlXferTelemetry,
    nixl_thread_sync_t,
)

# NIXL callers watch the "nixl" logger (nixl.logging); kvt logs there.
log = logging.getLogger("nixl")

# Backend names a caller may ask for: kvt serves them all with its own
# transports (tcp, same-host shm, UCX), chosen per peer.
SERVED_BACKENDS = ("UCX", "KVT", "UCX_MO", "LIBFABRIC", "UCCL", "MOONCAKE")
NOTIF_MAX = 1 << 20  # one notification, after reassembly

_MEM = {
    "DRAM": nixlBind.DRAM_SEG,
    "VRAM": nixlBind.VRAM_SEG,
    "FILE": nixlBind.FILE_SEG,
    "BLOCK": nixlBind.BLK_SEG,
    "OBJ": nixlBind.OBJ_SEG,
    "cpu": nixlBind.DRAM_SEG,
    "cuda": nixlBind.VRAM_SEG,
}
_OPS = {"WRITE": nixlBind.NIXL_WRITE, "READ": nixlBind.NIXL_READ}
_MOVABLE = (nixlBind.DRAM_SEG, nixlBind.VRAM_SEG)

# kvt status -> the NIXL exception a NIXL backend raises for that cause.
_ERRORS = {
    -1: nixlInvalidParamError,     # KVT_ERR_INVALID_PARAM
    -3: nixlNotSupportedError,     # KVT_ERR_NOT_SUPPORTED
    -5: nixlNotFoundError,         # KVT_ERR_NOT_FOUND
    -6: nixlNotAllowedError,       # KVT_ERR_EXISTS
    -7: nixlNotFoundError,         # KVT_ERR_NOT_REGISTERED
    -8: nixlNotFoundError,         # KVT_ERR_ACCESS
    -9: nixlRemoteDisconnectError,  # KVT_ERR_IO (no means to reach it)
    -10: nixlRemoteDisconnectError,  # KVT_ERR_TIMEDOUT (UCX: ep timeout)
    -11: nixlRemoteDisconnectError,  # KVT_ERR_UNREACHABLE
    -12: nixlRemoteDisconnectError,  # KVT_ERR_CONN_LOST
    -15: nixlCancelledError,       # KVT_ERR_CANCELED
    -18: nixlCancelledError,       # KVT_ERR_CLOSED
    -20: nixlNotAllowedError,      # KVT_ERR_AUTH
}
_warned_backend = False


def _raise(status, what):
    exc = _ERRORS.get(int(status), nixlBackendError)
    raise exc("%s: %s (kvt status %d)" % (what, kvt.status_str(int(status)),
                                          int(status)))


def _is_tensor(obj):
    torch = sys.modules.get("torch")
    return torch is not None and isinstance(obj, torch.Tensor)


def _tensor_rows(tensors):
    """(rows, mem type name) of contiguous tensors, or None."""
    rows = np.zeros((len(tensors), 3), dtype=np.uint64)
    dev0 = tensors[0].device
    for i, t in enumerate(tensors):
        if t.device != dev0:
            log.error("tensors on different devices in one list")
            return None
        if not t.is_contiguous():
            log.error("Please use a list of contiguous Tensors")
            return None
        gpu = t.get_device()
        rows[i] = (t.data_ptr(), t.numel() * t.element_size(),
                   0 if gpu == -1 else gpu)
    return rows, ("DRAM" if tensors[0].get_device() == -1 else "VRAM")


def _host_ip():
    """The address this agent listens on and gives to peers."""
    host = os.environ.get("KVT_NIXL_HOST")
    if host:
        return host
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            # No packet is sent: connect() on UDP only picks the route.
            s.connect(("10.255.255.255", 1))
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def _encode_notif(name, msg_id, msg):
    """The kvt notification payloads carrying @msg from agent @name: one,
    or fragments when it is longer than one kvt notification."""
    nb = name.encode()
    room = NOTIFY_MAX - 14 - len(nb)
    if room < 64:
        raise nixlInvalidParamError("agent name too long for notifications")
    if len(msg) > NOTIF_MAX:
        raise nixlInvalidParamError(
            "notification of %d bytes is over %d" % (len(msg), NOTIF_MAX))
    n = max(1, -(-len(msg) // room))
    msg_id &= 0xffffffff
    return tuple(struct.pack(">2sBBHIHH", b"\xa7N", 1, 0, len(nb), msg_id, i,
                             n) + nb + msg[i * room:(i + 1) * room]
                 for i in range(n))


def _name(n):
    """An agent name as str (NIXL takes bytes too: add_remote_agent
    returns them)."""
    if isinstance(n, (bytes, bytearray)):
        return bytes(n).decode()
    return n


def _as_msg(m):
    if isinstance(m, str):
        return m.encode()
    return bytes(m)


class nixl_agent_config:
    """Configuration of an agent (NIXL's arguments, in NIXL's order).

    kvt has no progress thread to turn on or off (its transports' workers
    always run) and no per-backend thread count: enable_prog_thread and
    num_threads are accepted and kept.
    """

    def __init__(self, enable_prog_thread: bool = True,
                 enable_listen_thread: bool = False,
                 listen_port: int = DEFAULT_COMM_PORT,
                 capture_telemetry: bool = False, num_threads: int = 0,
                 backends: list = ["UCX"],
                 sync_mode: Optional[nixl_thread_sync_t] = None):
        self.backends = backends
        self.enable_pthread = enable_prog_thread
        self.enable_listen = enable_listen_thread
        self.port = listen_port
        self.capture_telemetry = capture_telemetry
        self.num_threads = num_threads
        if sync_mode is not None and not isinstance(sync_mode,
                                                    nixl_thread_sync_t):
            raise TypeError("sync_mode must be a nixl_thread_sync_t (got %r)"
                            % type(sync_mode).__name__)
        self.sync_mode = sync_mode


nixl_backend_handle = int


class nixl_prepped_dlist_handle:
    """A prepared descriptor list: its rows, and the peer it addresses
    (None for the local side)."""

    __slots__ = ("_agent", "_rows", "_remote", "_released")

    def __init__(self, agent, rows, remote):
        self._agent = agent
        self._rows = rows
        self._remote = remote
        self._released = False

    def release(self):
        self._released = True
        self._rows = None

    def __repr__(self):
        return "nixl_prepped_dlist_handle(%s, released=%s)" % (
            "local" if self._remote is None else self._remote, self._released)


class nixl_xfer_handle:
    """A transfer request: its merged descriptors, the peer and the
    notification; posted any number of times, one post at a time."""

    __slots__ = ("_agent", "_op", "_la", "_ra", "_ln", "_remote", "_notif",
                 "_post", "_released", "_lock")

    def __init__(self, agent, op, la, ra, ln, remote, notif):
        self._agent = agent
        self._op = op
        self._la, self._ra, self._ln = la, ra, ln
        self._remote = remote
        self._notif = notif
        self._post = None
        self._released = False
        self._lock = threading.Lock()

    def release(self):
        self._agent._release_xfer(self)

    def __repr__(self):
        return "nixl_xfer_handle(%s, %d descriptors, released=%s)" % (
            self._remote, len(self._la), self._released)

    def __del__(self):
        try:
            if not self._released and self._post is not None:
                self._agent._abandon(self._post)
        except Exception:
            pass


class _Remote:
    """What an agent knows of a peer: its kvt segment and its regions,
    sorted by address (kvt's regions never overlap)."""

    def __init__(self, name):
        self.name = name
        self.segment = None
        self.regions = {}  # addr -> (addr, len, dev, mem)
        self._index()

    def merge(self, segment, regions):
        """Full metadata (with the segment) replaces what was known, as
        the peer may have re-registered; partial metadata adds to it."""
        new = {} if segment is not None else dict(self.regions)
        for r in regions:
            new[r[0]] = r
        if segment is not None:
            self.segment = segment
        self.regions = new
        self._index()

    def _index(self):
        rs = sorted(self.regions.values())
        # One tuple, replaced whole: readers take it without the lock.
        self.index = (np.array([r[0] for r in rs], dtype=np.uint64),
                      np.array([r[0] + r[1] for r in rs], dtype=np.uint64))

    def covers(self, rows):
        starts, ends = self.index
        return _covered(starts, ends, rows)


def _covered(starts, ends, rows):
    """Whether every row's [addr, +len) lies inside one region."""
    if rows.shape[0] == 0:
        return True
    if starts.size == 0:
        return False
    addr, ln = rows[:, 0], rows[:, 1]
    i = np.searchsorted(starts, addr, side="right").astype(np.int64) - 1
    ok = i >= 0
    j = np.where(ok, i, 0)
    # ln <= end - addr: addr + ln could wrap around 2^64.
    return bool(np.all(ok & (addr < ends[j]) & (ln <= ends[j] - addr)))


class nixl_agent:
    """A NIXL agent on a kvt engine.

    Thread safety: every method may be called from any thread; the
    agent's tables are guarded by one lock, never held across network I/O
    or a wait.
    """

    def __init__(self, agent_name: str,
                 nixl_conf: Optional[nixl_agent_config] = None,
                 instantiate_all: bool = False):
        global _warned_backend
        if not isinstance(agent_name, str) or not agent_name:
            raise ValueError("agent name must be a non-empty string")
        conf = nixl_conf or nixl_agent_config()
        self.name = agent_name
        self._conf = conf
        self._lock = threading.RLock()
        # Message ids start at random: a sender restarted on the same
        # address must not continue another's fragments.
        self._msg_ids = itertools.count(int.from_bytes(os.urandom(4),
                                                       "little"))
        self._poll_lock = threading.Lock()
        self.notifs = {}
        self.backends = {}
        self.backend_mems = {}
        self.backend_options = {}
        self.plugin_list = list(SERVED_BACKENDS)
        self.nixl_mems = dict(_MEM)
        self.nixl_ops = dict(_OPS)
        self._remotes = {}
        self._regs = {}  # addr -> (addr, len, dev, mem)
        self._reg_index = (np.zeros(0, dtype=np.uint64),
                           np.zeros(0, dtype=np.uint64))
        self._partial = {}  # (segment, name, msg id) -> [fragments]
        self._abandoned = []
        self._listener = None
        self._etcd = None
        self._watched = {}  # remote name -> etcd key it was fetched from
        self._watcher = None
        self._closed = False

        wanted = list(SERVED_BACKENDS) if instantiate_all and not nixl_conf \
            else list(conf.backends)
        for b in wanted:
            if b in SERVED_BACKENDS:
                self.create_backend(b)
            else:
                log.warning("Skipping backend registration %s due to the "
                            "missing plugin.", b)
        if self.backends and not _warned_backend:
            _warned_backend = True
            log.info("kvt serves NIXL backend(s) %s with its own transports",
                     ", ".join(self.backends))

        self._host = _host_ip()
        proto = "tcp" if os.environ.get("KVT_NIXL_PROTOCOL") == "tcp" else ""
        self._engine = kvt.TransferEngine()
        if self._engine.initialize(self._host, "P2PHANDSHAKE", proto, "") != 0:
            raise nixlBackendError("kvt engine on %s did not start (see the "
                                   "kvt log)" % self._host)
        self._segment = "%s:%d" % (self._host, self._engine.get_rpc_port())
        if conf.enable_listen:
            self._listener = _meta.Listener(
                "0.0.0.0" if self._host not in ("127.0.0.1", "localhost")
                else self._host, conf.port, self._take_md, self._give_md,
                self._forget_md)
        eps = os.environ.get("NIXL_ETCD_ENDPOINTS")
        if eps:
            self._etcd = _meta.Etcd(eps)
        log.info("Initialized NIXL agent: %s (kvt segment %s)", agent_name,
                 self._segment)

    # ---- backends ---------------------------------------------------------

    def get_plugin_list(self):
        return self.plugin_list

    def get_plugin_mem_types(self, backend):
        return ["DRAM", "VRAM"] if backend in SERVED_BACKENDS else []

    def get_plugin_params(self, backend):
        return {}

    def get_backend_mem_types(self, backend):
        return self.backend_mems.get(backend, [])

    def get_backend_params(self, backend):
        return self.backend_options.get(backend, {})

    def create_backend(self, backend, initParams={}):
        if backend not in SERVED_BACKENDS:
            raise nixlNotFoundError("no backend %s in kvt (kvt serves %s)"
                                    % (backend, ", ".join(SERVED_BACKENDS)))
        self.backends[backend] = len(self.backends) + 1
        self.backend_mems[backend] = ["DRAM", "VRAM"]
        self.backend_options[backend] = dict(initParams)
        log.info("Backend %s was instantiated", backend)

    # ---- memory -------------------------------------------------------------

    def _reindex_regs(self):
        rs = sorted(self._regs.values())
        self._reg_index = (np.array([r[0] for r in rs], dtype=np.uint64),
                           np.array([r[0] + r[1] for r in rs],
                                    dtype=np.uint64))

    def register_memory(self, reg_list, mem_type=None, backends=[]):
        descs = self.get_reg_descs(reg_list, mem_type)
        if descs is None:
            raise nixlInvalidParamError("no registration descriptors")
        mem = descs.getType()
        if not self.backends:
            raise nixlNotFoundError("no backend to register memory with "
                                    "(none of %s was served)"
                                    % (self._conf.backends,))
        if mem not in _MOVABLE:
            raise nixlNotSupportedError(
                "kvt moves DRAM and VRAM only, not %s" % mem.name)
        rows = descs._rows
        if mem == nixlBind.VRAM_SEG:
            locs = ["cuda:%d" % int(d) for d in rows[:, 2]]
        else:
            locs = ["cpu:0"] * rows.shape[0]
        with self._lock:
            for i in range(rows.shape[0]):
                st = self._engine.register_memory(int(rows[i, 0]),
                                                  int(rows[i, 1]), locs[i])
                if st != 0:
                    for j in range(i):
                        self._engine.unregister_memory(int(rows[j, 0]))
                        self._regs.pop(int(rows[j, 0]), None)
                    self._reindex_regs()
                    _raise(st, "register_memory")
                self._regs[int(rows[i, 0])] = (int(rows[i, 0]),
                                               int(rows[i, 1]),
                                               int(rows[i, 2]), int(mem))
            self._reindex_regs()
        return descs

    def deregister_memory(self, dereg_list, backends=[]):
        rows = dereg_list._rows
        first = 0
        with self._lock:
            for i in range(rows.shape[0]):
                st = self._engine.unregister_memory(int(rows[i, 0]))
                self._regs.pop(int(rows[i, 0]), None)
                if st != 0 and first == 0:
                    first = st
            self._reindex_regs()
        if first != 0:
            _raise(first, "deregister_memory")

    def query_memory(self, reg_list, backend, mem_type=None):
        if backend not in self.backends:
            raise ValueError("Backend '%s' not found. Available backends: %s"
                             % (backend, list(self.backends)))
        descs = self.get_reg_descs(reg_list, mem_type)
        return [None] * descs.descCount()

    def make_connection(self, remote_agent, backends=[]):
        seg = self._remote_segment(remote_agent)
        if self._engine.send_probe(seg) != 0:
            raise nixlRemoteDisconnectError("%s (%s) does not answer"
                                            % (remote_agent, seg))

    # ---- descriptor lists ---------------------------------------------------

    def get_xfer_descs(self, descs, mem_type=None):
        return self._descs(descs, mem_type, nixlXferDList, nixlRegDList, 3,
                           "transfer")

    def get_reg_descs(self, descs, mem_type=None):
        return self._descs(descs, mem_type, nixlRegDList, nixlXferDList, 4,
                           "registration")

    def _descs(self, descs, mem_type, cls, other, width, what):
        """A @cls list from any of NIXL's inputs (a list of @width-tuples,
        an N x 3 array, a tensor, a list of tensors), or None with an error
        log, as NIXL does; an unknown memory type raises KeyError."""
        if isinstance(descs, cls):
            return descs
        if isinstance(descs, other):
            log.error("%s type detected for %s, please use %s",
                      other.__name__, what, cls.__name__)
            return None
        if _is_tensor(descs):
            if not descs.is_contiguous():
                log.error("Please use a list of contiguous Tensors")
                return None
            descs = [descs]
        elif isinstance(descs, np.ndarray):
            if mem_type is None:
                log.error("Please specify a mem type if not using Tensors")
                return None
            if descs.ndim != 2 or descs.shape[1] != 3:
                log.error("Nx3 shape required for %s descriptor list from "
                          "numpy array", what)
                return None
            return cls(self.nixl_mems[mem_type], descs)
        if len(descs) == 0:
            return None if mem_type is None else \
                cls(self.nixl_mems[mem_type], [])
        if isinstance(descs[0], tuple):
            if mem_type is None:
                log.error("Please specify a mem type if not using Tensors")
                return None
            mem = self.nixl_mems[mem_type]
            if len(descs[0]) != width:
                log.error("%d-tuple list needed for %s", width, what)
                return None
            try:
                return cls(mem, descs)
            except ValueError as e:
                log.error("bad %s descriptors: %s", what, e)
                return None
        if _is_tensor(descs[0]):
            r = _tensor_rows(descs)
            return None if r is None else cls(self.nixl_mems[r[1]], r[0])
        return None

    def get_remote_descs(self, descs, mem_type=None):
        if isinstance(descs, nixlBind.nixlRemoteDList):
            return descs
        if descs and isinstance(descs[0], tuple) and mem_type is not None \
                and len(descs[0]) == 4:
            return nixlBind.nixlRemoteDList(self.nixl_mems[mem_type], descs)
        return None

    def get_serialized_descs(self, descs):
        return pickle.dumps(descs)

    def deserialize_descs(self, serialized_descs):
        return pickle.loads(serialized_descs)

    # ---- preparing transfers ------------------------------------------------

    def _check_local(self, rows, what):
        starts, ends = self._reg_index
        if not _covered(starts, ends, rows):
            raise nixlNotFoundError("%s: a local descriptor is not inside "
                                    "memory registered with this agent" % what)

    def _check_remote(self, name, rows, what):
        with self._lock:
            r = self._remotes.get(name)
        if r is None or r.segment is None:
            raise nixlNotFoundError("%s: no metadata of agent %r (add_remote_"
                                    "agent or fetch_remote_metadata first)"
                                    % (what, name))
        if not r.covers(rows):
            raise nixlNotFoundError("%s: a descriptor is not inside memory "
                                    "agent %r registered" % (what, name))

    def _side(self, agent_name, descs, what):
        """(rows, remote name or None) of one side of a transfer."""
        if descs.getType() not in _MOVABLE:
            raise nixlNotSupportedError("kvt moves DRAM and VRAM only, not %s"
                                        % descs.getType().name)
        rows = descs._rows
        agent_name = _name(agent_name)
        if agent_name in ("", "NIXL_INIT_AGENT"):
            self._check_local(rows, what)
            return rows, None
        if agent_name == self.name:
            self._check_local(rows, what)
            return rows, self.name
        self._check_remote(agent_name, rows, what)
        return rows, agent_name

    def prep_xfer_dlist(self, agent_name, xfer_list, mem_type=None,
                        backends=[]):
        if isinstance(xfer_list, np.ndarray) and xfer_list.ndim == 2 \
                and xfer_list.shape[1] == 5:
            if mem_type is None:
                raise ValueError("Please specify a mem type for strided "
                                 "descriptors")
            xfer_list = _expand_strided(xfer_list)
        descs = self.get_xfer_descs(xfer_list, mem_type)
        if descs is None:
            raise nixlInvalidParamError("prep_xfer_dlist: no descriptors")
        rows, remote = self._side(agent_name, descs, "prep_xfer_dlist")
        return nixl_prepped_dlist_handle(self, rows, remote)

    def _make(self, op, lrows, rrows, remote, notif):
        if remote is None:
            raise nixlInvalidParamError("the remote side was prepared as "
                                        "local (NIXL_INIT_AGENT)")
        if lrows.shape[0] != rrows.shape[0]:
            raise nixlInvalidParamError(
                "%d local and %d remote descriptors" % (lrows.shape[0],
                                                        rrows.shape[0]))
        if not np.array_equal(lrows[:, 1], rrows[:, 1]):
            raise nixlInvalidParamError("local and remote descriptor lengths "
                                        "differ")
        lreg = np.searchsorted(self._reg_index[0], lrows[:, 0], side="right")
        if remote == self.name:
            rreg = np.searchsorted(self._reg_index[0], rrows[:, 0],
                                   side="right")
        else:
            with self._lock:
                r = self._remotes.get(remote)
            starts = r.index[0] if r is not None else np.zeros(0, np.uint64)
            rreg = np.searchsorted(starts, rrows[:, 0], side="right")
        la, ra, ln = _merge(lrows[:, 0], rrows[:, 0], lrows[:, 1], lreg, rreg)
        return nixl_xfer_handle(self, int(_OPS[op]), la, ra, ln, remote,
                                _as_msg(notif))

    def make_prepped_xfer(self, operation, local_xfer_side, local_indices,
                          remote_xfer_side, remote_indices, notif_msg=b"",
                          backends=[], skip_desc_merge=False):
        if operation not in _OPS:
            raise KeyError(operation)
        for h in (local_xfer_side, remote_xfer_side):
            if h._released:
                raise nixlInvalidParamError("descriptor list handle was "
                                            "released")
        if local_xfer_side._remote is not None:
            raise nixlInvalidParamError("the local side was prepared for "
                                        "agent %r" % local_xfer_side._remote)
        li = np.asarray(local_indices, dtype=np.int64).reshape(-1)
        ri = np.asarray(remote_indices, dtype=np.int64).reshape(-1)
        if li.size == 0 or li.size != ri.size:
            raise nixlInvalidParamError(
                "%d local and %d remote indices" % (li.size, ri.size))
        nl, nr = local_xfer_side._rows.shape[0], remote_xfer_side._rows.shape[0]
        if li.size and (li.min() < 0 or li.max() >= nl) or \
                ri.size and (ri.min() < 0 or ri.max() >= nr):
            raise nixlInvalidParamError("an index is outside its prepared "
                                        "list")
        return self._make(operation, local_xfer_side._rows[li],
                          remote_xfer_side._rows[ri],
                          remote_xfer_side._remote, notif_msg)

    def initialize_xfer(self, operation, local_descs, remote_descs,
                        remote_agent, notif_msg=b"", backends=[]):
        if operation not in _OPS:
            raise KeyError(operation)
        lrows, _ = self._side("", local_descs, "initialize_xfer")
        rrows, remote = self._side(remote_agent, remote_descs,
                                   "initialize_xfer")
        return self._make(operation, lrows, rrows, remote, notif_msg)

    def estimate_xfer_cost(self, req_handle):
        raise nixlNotSupportedError("kvt has no cost model")

    # ---- posting and checking -------------------------------------------------

    def _reap(self):
        with self._lock:
            keep = [p for p in self._abandoned if p.state() == 1]
            self._abandoned = keep

    def _abandon(self, post):
        with self._lock:
            self._abandoned.append(post)

    def transfer(self, handle, notif_msg=b""):
        with handle._lock:
            if handle._released:
                raise nixlInvalidParamError("transfer handle was released")
            if handle._post is not None and handle._post.state() == 1:
                raise nixlRepostActiveError("the transfer is still active")
            msg = _as_msg(notif_msg) if notif_msg else handle._notif
            if notif_msg:
                handle._notif = msg
            seg = self._remote_segment(handle._remote)
            frags = _encode_notif(self.name, next(self._msg_ids), msg) \
                if msg else ()
            old, handle._post = handle._post, None
            try:
                post = self._engine._post(seg, handle._op, handle._la,
                                          handle._ra, handle._ln, frags)
            except kvt.Error as e:
                _raise(getattr(e, "status", -9), "transfer to %s"
                       % handle._remote)
            handle._post = post
        if old is not None:
            old.release()
        if self._abandoned:
            self._reap()
        st = post.state()
        if st == 0:
            return "DONE"
        if st == 1:
            return "PROC"
        _raise(st, "transfer to %s" % handle._remote)

    def check_xfer_state(self, handle):
        post = handle._post
        if post is None:
            if handle._released:
                raise nixlInvalidParamError("transfer handle was released")
            raise nixlBind.nixlNotPostedError("the transfer was never posted")
        try:
            st = post.state()
        except kvt.StateError:
            raise nixlInvalidParamError("transfer handle was released")
        if st == 0:
            return "DONE"
        if st == 1:
            return "PROC"
        _raise(st, "transfer to %s" % handle._remote)

    def get_xfer_telemetry(self, handle):
        if not self._conf.capture_telemetry:
            raise nixlNoTelemetryError("telemetry is off "
                                       "(nixl_agent_config(capture_telemetry"
                                       "=True))")
        post = handle._post
        if post is None:
            raise nixlBind.nixlNotPostedError("the transfer was never posted")
        return nixlXferTelemetry(*post.telemetry())

    def query_xfer_backend(self, handle):
        return next(iter(self.backends), "UCX")

    def _release_xfer(self, handle):
        with handle._lock:
            if handle._released:
                return
            post = handle._post
            if post is not None and post.state() == 1:
                # NIXL cancels, or raises and keeps the handle when it
                # cannot. kvt cannot recall bytes in flight: the caller
                # must keep the memory until the transfer ends (vLLM keeps
                # the handle and its blocks, and retries).
                raise nixlBackendError(
                    "the transfer is still active and kvt cannot cancel "
                    "bytes in flight; release it once check_xfer_state is "
                    "not PROC (each transfer is bounded by the transfer "
                    "timeout)")
            handle._released = True
            handle._post = None
        if post is not None:
            post.release()

    def release_xfer_handle(self, handle):
        self._release_xfer(handle)

    def release_dlist_handle(self, handle):
        handle.release()

    # ---- notifications -------------------------------------------------------

    def _poll_notifs(self):
        """New complete notifications, {agent: [bytes]}, in arrival order.
        One thread at a time: fragments are taken in order."""
        with self._poll_lock:
            return self._poll_notifs_locked()

    def _poll_notifs_locked(self):
        out = {}
        for seg, payload in self._engine._notify_recv_raw(0):
            if len(payload) < 14 or payload[:2] != b"\xa7N":
                log.warning("dropping a notification from %s that is not a "
                            "NIXL agent's", seg)
                continue
            _, ver, _, nl, mid, idx, n = struct.unpack(">2sBBHIHH",
                                                       payload[:14])
            name = payload[14:14 + nl].decode(errors="replace")
            data = payload[14 + nl:]
            if n == 1:
                out.setdefault(name, []).append(data)
                continue
            key = (seg, name, mid)
            nparts, parts = self._partial.get(key, (n, []))
            if idx != len(parts) or n != nparts or \
                    n * NOTIFY_MAX > 2 * NOTIF_MAX:
                log.warning("notification %d from %s lost a fragment or "
                            "is malformed; dropped", mid, name)
                self._partial.pop(key, None)
                continue
            parts.append(data)
            if len(parts) < n:
                self._partial[key] = (n, parts)
                # A sender that died mid-message leaves its fragments: keep
                # a bounded number of unfinished messages.
                while len(self._partial) > 64:
                    self._partial.pop(next(iter(self._partial)))
                continue
            self._partial.pop(key, None)
            out.setdefault(name, []).append(b"".join(parts))
        return out

    def get_new_notifs(self, backends=[]):
        return self._poll_notifs()

    def update_notifs(self, backends=[]):
        new = self._poll_notifs()
        with self._lock:
            for k, v in new.items():
                self.notifs.setdefault(k, []).extend(v)
            return self.notifs

    def check_remote_xfer_done(self, remote_agent_name, lookup_tag,
                               backends=[], tag_is_prefix=True):
        self.update_notifs()
        remote_agent_name = _name(remote_agent_name)
        tag = _as_msg(lookup_tag)
        with self._lock:
            msgs = self.notifs.get(remote_agent_name, [])
            for i, m in enumerate(msgs):
                if (m.startswith(tag) if tag_is_prefix else tag in m):
                    del msgs[i]
                    return True
        return False

    def send_notif(self, remote_agent_name, notif_msg, backend=None):
        seg = self._remote_segment(remote_agent_name)
        for frag in _encode_notif(self.name, next(self._msg_ids),
                                  _as_msg(notif_msg)):
            st = self._engine._notify_send_raw(seg, frag)
            if st != 0:
                _raise(st, "send_notif to %s" % remote_agent_name)

    # ---- metadata -----------------------------------------------------------

    def _regions(self, rows=None):
        with self._lock:
            regs = list(self._regs.values())
        if rows is None:
            return regs
        keep = set(int(a) for a in rows[:, 0])
        return [r for r in regs if r[0] in keep]

    def get_agent_metadata(self):
        return _meta.encode(self.name, self._segment, self._regions())

    def get_partial_agent_metadata(self, descs, inc_conn_info=False,
                                   backends=[]):
        with self._lock:
            regs = dict(self._regs)
        picked = []
        for i in range(descs.descCount()):
            a, n = int(descs._rows[i, 0]), int(descs._rows[i, 1])
            r = regs.get(a)
            if r is None or r[1] != n:
                raise nixlNotFoundError(
                    "partial metadata: (%#x, %d) is not a region registered "
                    "with this agent (descriptors as registered are needed)"
                    % (a, n))
            picked.append(r)
        return _meta.encode(self.name,
                            self._segment if inc_conn_info else None, picked)

    def add_remote_agent(self, metadata):
        name, seg, regions = _meta.decode(metadata)
        if name == self.name:
            raise nixlInvalidParamError("that is this agent's own metadata")
        with self._lock:
            r = self._remotes.get(name)
            if r is None:
                if seg is None:
                    raise nixlNotFoundError(
                        "partial metadata of %r without connection info, "
                        "and its full metadata was never loaded" % name)
                r = self._remotes[name] = _Remote(name)
            r.merge(seg, regions)
        return name.encode()

    def remove_remote_agent(self, agent):
        agent = _name(agent)
        with self._lock:
            self._watched.pop(agent, None)
            if self._remotes.pop(agent, None) is None:
                raise nixlNotFoundError("no remote agent %r" % agent)

    def _remote_segment(self, name):
        name = _name(name)
        if name == self.name:
            return self._segment
        with self._lock:
            r = self._remotes.get(name)
        if r is None or r.segment is None:
            raise nixlNotFoundError("no metadata of agent %r" % name)
        return r.segment

    def check_remote_metadata(self, agent, descs=None):
        agent = _name(agent)
        with self._lock:
            r = self._remotes.get(agent)
        if r is None or r.segment is None:
            return False
        if descs is None or descs.isEmpty():
            return True
        return r.covers(descs._rows)

    # The listener's callbacks.
    def _take_md(self, blob):
        self.add_remote_agent(blob)

    def _give_md(self, name):
        return self.get_agent_metadata() if name in ("", self.name) else b""

    def _forget_md(self, name):
        with self._lock:
            self._remotes.pop(name, None)

    def _background(self, what, fn):
        def run():
            try:
                fn()
            except Exception as e:
                log.warning("nixl %s failed: %s", what, e)
        threading.Thread(target=run, daemon=True,
                         name="kvt-nixl-" + what).start()

    def send_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        blob = self.get_agent_metadata()
        self._send_md(blob, ip_addr, port, "")

    def send_partial_agent_metadata(self, descs, inc_conn_info=False,
                                    backends=[], ip_addr="",
                                    port=DEFAULT_COMM_PORT, label=""):
        blob = self.get_partial_agent_metadata(descs, inc_conn_info)
        self._send_md(blob, ip_addr, port, label)

    def _send_md(self, blob, ip_addr, port, label):
        if ip_addr:
            self._background("send-metadata", lambda: _meta.request(
                ip_addr, port, b"S", blob, False))
        elif self._etcd is not None:
            self._etcd.put(self._etcd.key(self.name, label), blob)
        else:
            raise nixlInvalidParamError("no peer address and no etcd "
                                        "(NIXL_ETCD_ENDPOINTS)")

    def fetch_remote_metadata(self, remote_agent, ip_addr="",
                              port=DEFAULT_COMM_PORT, label=""):
        remote_agent = _name(remote_agent)
        if ip_addr:
            def fetch():
                blob = _meta.request(ip_addr, port, b"F",
                                     remote_agent.encode(), True)
                if blob:
                    self.add_remote_agent(blob)
            self._background("fetch-metadata", fetch)
        elif self._etcd is not None:
            etcd = self._etcd

            key = etcd.key(remote_agent, label)

            def fetch():
                deadline = time.monotonic() + _meta.NET_TIMEOUT
                blob = etcd.get(key)
                while blob is None and time.monotonic() < deadline:
                    time.sleep(0.05)
                    blob = etcd.get(key)
                if blob is None:
                    raise nixlNotFoundError("no metadata of %r in etcd"
                                            % remote_agent)
                self.add_remote_agent(blob)
                self._watch(remote_agent, key)
            self._background("fetch-metadata", fetch)
        else:
            raise nixlInvalidParamError("no peer address and no etcd "
                                        "(NIXL_ETCD_ENDPOINTS)")

    def _watch(self, name, key):
        """Forget @name once its etcd key is deleted (its owner invalidated
        it): one thread per agent polls the watched keys every 100 ms."""
        with self._lock:
            self._watched[name] = key
            if self._watcher is not None:
                return
            self._watcher = threading.Thread(
                target=_watch_loop, args=(weakref.ref(self), self._etcd),
                daemon=True, name="kvt-nixl-etcd-watch")
            self._watcher.start()

    def invalidate_local_metadata(self, ip_addr="", port=DEFAULT_COMM_PORT):
        if ip_addr:
            self._background("invalidate-metadata", lambda: _meta.request(
                ip_addr, port, b"I", self.name.encode(), False))
        elif self._etcd is not None:
            self._etcd.delete_prefix("%s/%s/" % (self._etcd.ns, self.name))
        else:
            raise nixlInvalidParamError("no peer address and no etcd "
                                        "(NIXL_ETCD_ENDPOINTS)")

    # ---- kvt additions ------------------------------------------------------

    def get_segment_name(self):
        """The kvt segment (host:port) this agent's engine serves."""
        return self._segment

    def close(self):
        """Stop the listener and wait for abandoned transfers; the engine
        goes with the agent."""
        self._closed = True
        if self._listener is not None:
            self._listener.close()
            self._listener = None
        with self._lock:
            posts, self._abandoned = self._abandoned, []
        for p in posts:
            p.release()

    def __del__(self):
        try:
            if self._listener is not None:
                self._listener.close()
        except Exception:
            pass


def _watch_loop(ref, etcd):
    while True:
        time.sleep(0.1)
        agent = ref()
        if agent is None or agent._closed:
            return
        with agent._lock:
            watched = dict(agent._watched)
        del agent
        gone = []
        for name, key in watched.items():
            try:
                if etcd.get(key) is None:
                    gone.append(name)
            except nixlBackendError:
                pass  # etcd unreachable for now: keep what is known
        agent = ref()
        if agent is None:
            return
        with agent._lock:
            for name in gone:
                if agent._watched.get(name) == watched[name]:
                    del agent._watched[name]
                    agent._remotes.pop(name, None)
        del agent


def _merge(la, ra, ln, lreg, rreg):
    """Merge runs of descriptors contiguous on both sides and inside one
    registered region on each (@lreg, @rreg: the region of each)."""
    la = np.ascontiguousarray(la, dtype=np.uint64)
    ra = np.ascontiguousarray(ra, dtype=np.uint64)
    ln = np.ascontiguousarray(ln, dtype=np.uint64)
    if la.size <= 1:
        return la, ra, ln
    lend, rend = la[:-1] + ln[:-1], ra[:-1] + ln[:-1]
    brk = ((la[1:] != lend) | (ra[1:] != rend) | (lend < la[:-1]) |
           (rend < ra[:-1]) | (lreg[1:] != lreg[:-1]) |
           (rreg[1:] != rreg[:-1]))
    starts = np.flatnonzero(np.concatenate(([True], brk)))
    if starts.size == la.size:
        return la, ra, ln
    return (np.ascontiguousarray(la[starts]), np.ascontiguousarray(ra[starts]),
            np.add.reduceat(ln, starts).astype(np.uint64))


def _expand_strided(arr):
    """Rows of an N x 5 (address, len, device, stride, count) array."""
    out = []
    for addr, ln, dev, stride, count in np.asarray(arr, dtype=np.uint64):
        for k in range(int(count)):
            out.append((int(addr) + k * int(stride), int(ln), int(dev)))
    return np.array(out, dtype=np.uint64).reshape(-1, 3)
