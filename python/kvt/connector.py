# SPDX-License-Identifier: Apache-2.0
"""kvt.connector: the prefill/decode KV connector, in the shape of SGLang's
disaggregation interface (``KVArgs``, ``KVPoll``, ``KVManager``,
``KVSender``, ``KVReceiver``, ``KVBootstrapServer``), implemented by kvt's
C connector (include/kvt/connector.h, docs/connector.md).

A prefill rank::

    mgr = KVManager(args, DisaggregationMode.PREFILL)   # registers with the
                                                        # bootstrap server
    sender = KVSender(mgr, bootstrap_addr, bootstrap_room)
    sender.init(num_kv_indices, aux_index)
    sender.send(kv_indices)                             # whole request
    while sender.poll() not in (KVPoll.Success, KVPoll.Failed): ...

or layer by layer::

    step = mgr.step_begin()
    sender.send_step(step, kv_indices)                  # before the forward
    for layer in range(num_layers):
        ...compute...
        mgr.layer_ready(step, layer)
    mgr.step_end(step)                                  # aux items ready

A decode rank::

    mgr = KVManager(args, DisaggregationMode.DECODE)
    receiver = KVReceiver(mgr, bootstrap_addr, bootstrap_room)
    receiver.init(kv_indices, aux_index)
    while receiver.poll() not in (KVPoll.Success, KVPoll.Failed): ...

A final state (Success or Failed) means the blocks may be reused: no
write of the room touches them any more.
"""

import dataclasses
import enum
from typing import List, Optional, Sequence, Union

from kvt import _kvt

__all__ = [
    "BlockLayout",
    "CacheKind",
    "DisaggregationMode",
    "KVArgs",
    "KVBootstrapServer",
    "KVCache",
    "KVManager",
    "KVPoll",
    "KVReceiver",
    "KVSender",
    "KVTransferError",
]


class KVPoll:
    """Room states, with SGLang's values."""

    Failed = 0
    Bootstrapping = 1
    WaitingForInput = 2
    Transferring = 3
    Success = 4


class DisaggregationMode(enum.Enum):
    NULL = "null"
    PREFILL = "prefill"
    DECODE = "decode"


class CacheKind(enum.IntEnum):
    K = _kvt.CACHE_K
    V = _kvt.CACHE_V
    LATENT = _kvt.CACHE_LATENT
    K_SCALE = _kvt.CACHE_K_SCALE
    V_SCALE = _kvt.CACHE_V_SCALE
    LATENT_SCALE = _kvt.CACHE_LATENT_SCALE
    KV = _kvt.CACHE_KV  # K and V of a layer together, by head


class BlockLayout(enum.IntEnum):
    TOKEN_MAJOR = _kvt.BLOCK_TOKEN_MAJOR  # [token][head][head_bytes]
    HEAD_MAJOR = _kvt.BLOCK_HEAD_MAJOR  # [head][token][head_bytes]


class KVTransferError(Exception):
    """Raised by failure_exception(): the room failed, with its reason."""

    def __init__(self, room: int, error: str, reason: str):
        super().__init__(f"room {room}: {reason} ({error})")
        self.room = room
        self.error = error
        self.reason = reason


@dataclasses.dataclass
class KVCache:
    """One paged cache of one layer (kvt_kv_cache_t)."""

    layer: int
    kind: int  # CacheKind
    ptr: int
    block_bytes: int
    num_blocks: int
    tokens_per_block: int
    heads: int = 1  # KV heads on this rank
    head_bytes: int = 0  # bytes per head per token; 0: block_bytes / tokens
    block_layout: int = BlockLayout.TOKEN_MAJOR

    def as_tuple(self):
        hb = self.head_bytes or self.block_bytes // (
            self.tokens_per_block * self.heads)
        return (self.layer, int(self.kind), int(self.block_layout),
                self.tokens_per_block, self.heads, hb, self.ptr,
                self.block_bytes, self.num_blocks)


class KVArgs:
    """What a rank's connector needs. The SGLang fields (kv_data_ptrs as K
    of every layer then V of every layer, or one latent buffer per layer
    for MLA; kv_item_lens the bytes per block; aux_*) describe the cache
    when ``caches`` is empty; ``caches`` (a list of KVCache) describes any
    layout, scales and draft layers included. ``kv_head_num`` and
    ``head_bytes`` are needed for different prefill and decode tp sizes."""

    def __init__(self):
        self.engine_rank: int = 0
        self.kv_data_ptrs: List[int] = []
        self.kv_data_lens: List[int] = []
        self.kv_item_lens: List[int] = []
        self.aux_data_ptrs: List[int] = []
        self.aux_data_lens: List[int] = []
        self.aux_item_lens: List[int] = []
        self.ib_device: Optional[str] = None
        # kvt's additions
        self.caches: List[KVCache] = []
        self.num_layers: int = 0  # target model; 0: derived
        self.num_draft_layers: int = 0
        self.page_size: int = 1  # tokens per block
        self.kv_head_num: int = 1  # KV heads on this rank
        self.head_bytes: int = 0  # 0: item_len / (page_size * kv_head_num)
        self.block_layout: int = BlockLayout.TOKEN_MAJOR
        self.is_mla: bool = False
        self.tp_rank: Optional[int] = None  # default: engine_rank % tp_size
        self.tp_size: int = 1
        self.dp_rank: int = 0
        self.dp_size: int = 1
        self.host: str = "127.0.0.1"
        self.bootstrap_addr: Optional[str] = None  # "host:port"
        self.bootstrap_timeout_ms: int = 0  # 0: kvt's default
        self.waiting_timeout_ms: int = 0
        self.transfer_timeout_ms: int = 0
        self.heartbeat_ms: int = 0
        self.peer_timeout_ms: int = 0
        self.submit_interval: int = 0
        self.register_ttl_s: int = -1
        # The engine's transports, by name ("tcp", "shm", "ucx", comma
        # separated); None: the engine's default (every one built in but
        # ucx, the best chosen per peer).
        self.transports: Optional[str] = None

    def build_caches(self) -> List[KVCache]:
        if self.caches:
            return list(self.caches)
        ptrs, lens, items = (self.kv_data_ptrs, self.kv_data_lens,
                             self.kv_item_lens)
        if not ptrs or len(ptrs) != len(lens) or len(ptrs) != len(items):
            raise ValueError("KVArgs: give caches, or kv_data_ptrs, "
                             "kv_data_lens and kv_item_lens of one length")
        per_layer = 1 if self.is_mla else 2
        if len(ptrs) % per_layer:
            raise ValueError("KVArgs: K and V buffers must pair up")
        layers = len(ptrs) // per_layer
        out = []
        for i, (ptr, ln, item) in enumerate(zip(ptrs, lens, items)):
            if self.is_mla:
                layer, kind, heads = i, CacheKind.LATENT, 1
            else:
                layer = i % layers
                kind = CacheKind.K if i < layers else CacheKind.V
                heads = self.kv_head_num
            out.append(KVCache(layer, kind, ptr, item, ln // item,
                               self.page_size, heads, self.head_bytes,
                               self.block_layout))
        return out

    def build_aux(self):
        return [(p, item, ln // item) for p, ln, item in zip(
            self.aux_data_ptrs, self.aux_data_lens, self.aux_item_lens)]


def _mode(mode) -> str:
    if isinstance(mode, DisaggregationMode):
        mode = mode.value
    mode = str(mode).lower()
    if mode not in ("prefill", "decode"):
        raise ValueError(f"unsupported disaggregation mode {mode!r}")
    return mode


class KVManager:
    """A rank's connector (kvt_conn_h) with its own engine. Prefill
    registers with the bootstrap server at ``args.bootstrap_addr``; decode
    uses it as the default for receivers."""

    def __init__(self, args: KVArgs, disaggregation_mode, server_args=None,
                 is_mla_backend: bool = False):
        if is_mla_backend:
            args.is_mla = True
        self.kv_args = args
        self.disaggregation_mode = _mode(disaggregation_mode)
        caches = args.build_caches()
        total = args.num_layers + args.num_draft_layers
        layers = args.num_layers or (max(c.layer for c in caches) + 1 -
                                     args.num_draft_layers)
        if total and total != max(c.layer for c in caches) + 1:
            raise ValueError("KVArgs: num_layers + num_draft_layers does "
                             "not match the caches' layers")
        tp_rank = (args.tp_rank if args.tp_rank is not None else
                   args.engine_rank % args.tp_size)
        self._conn = _kvt.Connector(
            self.disaggregation_mode, [c.as_tuple() for c in caches],
            layers, num_draft_layers=args.num_draft_layers,
            aux=args.build_aux(), bootstrap_addr=args.bootstrap_addr,
            tp_rank=tp_rank, tp_size=args.tp_size, dp_rank=args.dp_rank,
            dp_size=args.dp_size, local_host=args.host,
            bootstrap_timeout_ms=args.bootstrap_timeout_ms,
            waiting_timeout_ms=args.waiting_timeout_ms,
            transfer_timeout_ms=args.transfer_timeout_ms,
            heartbeat_ms=args.heartbeat_ms,
            peer_timeout_ms=args.peer_timeout_ms,
            submit_interval=args.submit_interval,
            register_ttl_s=args.register_ttl_s,
            transports=args.transports)

    @property
    def session_id(self) -> str:
        return self._conn.segment_name()

    def get_session_id(self) -> str:
        return self._conn.segment_name()

    # Layer-wise streaming (prefill).
    def step_begin(self) -> int:
        """Open a forward step; attach chunks with KVSender.send_step()."""
        return self._conn.step_begin()

    def layer_ready(self, step: int, layer: int) -> None:
        """Layers 0..layer of the step are computed: send them now."""
        self._conn.layer_ready(step, layer)

    def step_end(self, step: int) -> None:
        """Every layer and the aux items of the step are ready."""
        self._conn.step_end(step)

    def get_metrics(self) -> dict:
        """The connector's rooms: how many are in each state, how many
        entered and left each, the time spent in each and the prefill
        tail (docs/metrics.md)."""
        return self._conn.get_metrics()

    def close(self) -> None:
        self._conn.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()


IdList = Union[Sequence[int], "array.array", "numpy.ndarray"]  # noqa: F821


class _Room:
    def __init__(self, mgr: KVManager, room, bootstrap_room: int):
        self.kv_mgr = mgr
        self.bootstrap_room = bootstrap_room
        self._room = room

    def poll(self) -> int:
        """A KVPoll value."""
        return self._room.poll()

    def wait(self, timeout: Optional[float] = None) -> int:
        """Sleep until the room is final (or the timeout, in seconds)."""
        return self._room.wait(-1.0 if timeout is None else timeout)

    def info(self):
        """(state, error name, reason of the last change)."""
        return self._room.info()

    @property
    def reason(self) -> str:
        return self._room.info()[2]

    def abort(self, reason: Optional[str] = None) -> None:
        """Abort; the other side is told and acknowledges, then the room
        turns Failed."""
        self._room.abort(reason)

    def failure_exception(self):
        state, error, reason = self._room.info()
        raise KVTransferError(self.bootstrap_room, error, reason)

    def close(self) -> None:
        """Release the room (aborts and waits when not final)."""
        self._room.close()


class KVSender(_Room):
    """The prefill side of a room (SGLang's KVSender)."""

    def __init__(self, mgr: KVManager, bootstrap_addr: Optional[str],
                 bootstrap_room: int, *_args, **_kwargs):
        super().__init__(mgr, mgr._conn.sender(bootstrap_room),
                         bootstrap_room)
        self.num_kv_indices = None
        self.curr_idx = 0

    def init(self, num_kv_indices: int, aux_index=None) -> None:
        """The request has num_kv_indices blocks; its aux items are at
        aux_index (one slot for every aux buffer, a list of one per
        buffer, or None)."""
        self.num_kv_indices = num_kv_indices
        self._room.init_sender(num_kv_indices, aux_index)

    def _chunk(self, kv_indices, is_last):
        n = len(kv_indices)
        if is_last is None:
            is_last = self.curr_idx + n >= (self.num_kv_indices or 0)
        self.curr_idx += n
        return is_last

    def send(self, kv_indices: IdList, is_last: Optional[bool] = None):
        """Send the next chunk of blocks, every layer computed. is_last
        defaults to 'this chunk reaches num_kv_indices'."""
        is_last = self._chunk(kv_indices, is_last)
        self._room.send(kv_indices, is_last, 0)

    def send_step(self, step: int, kv_indices: IdList,
                  is_last: Optional[bool] = None):
        """Attach the next chunk to a forward step: its layers go as
        KVManager.layer_ready() marks them."""
        is_last = self._chunk(kv_indices, is_last)
        self._room.send(kv_indices, is_last, step)


class KVReceiver(_Room):
    """The decode side of a room (SGLang's KVReceiver)."""

    def __init__(self, mgr: KVManager, bootstrap_addr: Optional[str],
                 bootstrap_room: Optional[int] = None,
                 prefill_dp_rank: Optional[int] = None, *_args, **_kwargs):
        if bootstrap_room is None:
            raise ValueError("a KVReceiver needs a bootstrap_room")
        dp = -1 if prefill_dp_rank is None else prefill_dp_rank
        super().__init__(
            mgr, mgr._conn.receiver(bootstrap_room, bootstrap_addr, dp),
            bootstrap_room)

    def init(self, kv_indices: IdList, aux_index=None,
             prefix_blocks: int = 0) -> None:
        """Receive into kv_indices (logical blocks prefix_blocks.. of the
        request; decode already holds the prefix) and aux_index."""
        self._room.init_receiver(kv_indices, prefix_blocks, aux_index)


class KVBootstrapServer:
    """The bootstrap server (`kvt metad`) in this process: SGLang's /route
    registration and lookup and the /metadata store. It listens on
    127.0.0.1 unless `host` names an address ("0.0.0.0": every one)."""

    def __init__(self, port: int = 0, host: Optional[str] = None):
        self._server = _kvt.BootstrapServer(port, host)
        self.port = self._server.port()

    def close(self) -> None:
        self._server.close()

    def poll(self):
        return None
