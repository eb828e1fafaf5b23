# SPDX-License-Identifier: Apache-2.0
"""KvtConnector: vLLM's KV connector interface (KVConnectorBase_V1) on
kvt's C connector (kvt.connector, docs/connector.md).

The flow, for one request (docs/vllm.md):

1. The proxy sends the request to decode first, with kv_transfer_params
   ``{"do_remote_prefill": True, "transfer_id": T, "metaserver": URL}``.
2. Decode's scheduler asks for the prompt's KV beyond what its prefix
   cache holds (asynchronously), allocates the blocks, and its workers
   open a kvt receiver for room ``room_of(T)`` with those blocks (logical
   blocks ``first .. last`` of the request; the prefix is not sent). Rank
   0 then posts ``{"transfer_id": T, ...}`` to URL.
3. The proxy starts the request on prefill with
   ``{"do_remote_decode": True, "transfer_id": T}`` and ``max_tokens`` 1.
4. Prefill's workers open a kvt sender for the same room. In every forward
   step that computes the request's tokens, the blocks completed by the
   step are attached to the step; as vLLM finishes each layer
   (``save_kv_layer``) the connector marks it ready, and kvt writes that
   layer's blocks to every decode rank that reads them (different tensor
   parallel sizes on each side are kvt's strided writes).
5. Decode reports the request loaded once every prefill rank's last
   layer has landed; vLLM then computes the last prompt token and goes
   on. A room that fails (a peer died, a timeout, an abort) fails the
   request: vLLM's default ``kv_load_failure_policy`` "fail" ends it with
   an error, and the blocks are free again.

Blocks stay with their request until its room is final on both sides:
prefill delays freeing them until the sender is final (request_finished
returns True), and a decode request that ends while still receiving
(aborted by its client) has its receiver aborted, vLLM keeping its blocks
until the worker reports the receive final.

Options (``kv_connector_extra_config``): ``bootstrap_addr`` (host:port of
``kvt metad``; required), ``host`` (the address kvt's engine listens on,
default 127.0.0.1), ``transfer_timeout_ms``, ``bootstrap_timeout_ms``,
``waiting_timeout_ms``, ``peer_timeout_ms``, ``heartbeat_ms`` (kvt's
defaults when absent), ``metaserver_timeout_s`` (how long decode's post
to the proxy may take, default 30; past it the request fails), ``transports`` (kvt's transports by name, "tcp",
"shm", "ucx", comma separated; default: kvt's choice per peer, same-host
shm where it can), ``metrics_port`` (each rank serves kvt's
Prometheus metrics on metrics_port + its tensor-parallel rank).
"""

import dataclasses
import json
import logging
import threading
import urllib.request
from typing import TYPE_CHECKING, Any, Optional

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.base import (
    KVConnectorBase_V1, KVConnectorMetadata, KVConnectorRole,
    KVConnectorTransferResults)
from vllm.distributed.parallel_state import (
    get_tensor_model_parallel_rank, get_tensor_model_parallel_world_size)
from vllm.model_executor.models.utils import extract_layer_index

import kvt
from kvt.connector import (BlockLayout, CacheKind, KVArgs, KVCache,
                           KVManager, KVPoll, KVReceiver, KVSender)

if TYPE_CHECKING:
    from vllm.config import VllmConfig
    from vllm.forward_context import ForwardContext
    from vllm.v1.core.kv_cache_manager import KVCacheBlocks
    from vllm.v1.core.sched.output import SchedulerOutput
    from vllm.v1.kv_cache_interface import KVCacheConfig
    from vllm.v1.request import Request

log = logging.getLogger("kvt.vllm")

_FNV_OFFSET = 0xcbf29ce484222325
_FNV_PRIME = 0x100000001b3


def room_of(transfer_id: str) -> int:
    """The kvt room of a transfer id: FNV-1a over its UTF-8 bytes, kept
    to 63 bits (both sides compute it; a room is a 64-bit name)."""
    h = _FNV_OFFSET
    for b in transfer_id.encode():
        h = ((h ^ b) * _FNV_PRIME) & 0xffffffffffffffff
    return h & 0x7fffffffffffffff


# How long an empty step may wait for an open room to end. Without it
# vLLM's engine and worker spin at full speed through empty steps while a
# transfer runs, taking a CPU from the instance that computes the KV
# when both share a machine.
IDLE_WAIT_S = 0.005


def _cdiv(a: int, b: int) -> int:
    return -(-a // b)


@dataclasses.dataclass
class _Recv:
    """Decode: open a receiver for these blocks."""
    req_id: str
    transfer_id: str
    block_ids: list
    first_block: int
    metaserver: Optional[str]


@dataclasses.dataclass
class _Send:
    """Prefill: the request's blocks so far and its tokens computed once
    this step ends."""
    req_id: str
    transfer_id: str
    block_ids: list
    total_blocks: int
    tokens_after: int
    prompt_len: int


class KvtConnectorMetadata(KVConnectorMetadata):
    """What the scheduler tells every worker for one step."""

    def __init__(self):
        self.recv: list[_Recv] = []
        self.send: list[_Send] = []
        # Requests whose blocks the scheduler freed late (request_finished
        # returned True): each worker aborts the room if it is not final
        # and reports the request in finished_sending once it is.
        self.release: list[str] = []
        # The step runs no token: vLLM steps on, empty, while a request
        # waits for its KV (decode) or its blocks for their transfer
        # (prefill); the worker then sleeps a little on an open room
        # rather than spin (IDLE_WAIT_S).
        self.idle = False


class KvtConnector(KVConnectorBase_V1):
    """vLLM KV connector on kvt. Roles: kv_producer (prefill) and
    kv_consumer (decode)."""

    def __init__(self, vllm_config: "VllmConfig", role: KVConnectorRole,
                 kv_cache_config: "KVCacheConfig" = None):
        super().__init__(vllm_config, role, kv_cache_config)
        cfg = vllm_config.kv_transfer_config
        if cfg.is_kv_producer == cfg.is_kv_consumer:
            raise ValueError("KvtConnector: kv_role must be kv_producer "
                             "(prefill) or kv_consumer (decode), not "
                             f"{cfg.kv_role!r}")
        self.is_producer = cfg.is_kv_producer
        self.block_size = vllm_config.cache_config.block_size
        if role == KVConnectorRole.SCHEDULER:
            self._sched = _Scheduler(self.is_producer, self.block_size)
            self._worker = None
        else:
            self._sched = None
            self._worker = _Worker(vllm_config, self.is_producer,
                                   self.block_size)

    # ---- scheduler side -------------------------------------------------

    def get_num_new_matched_tokens(self, request: "Request",
                                   num_computed_tokens: int):
        return self._sched.matched(request, num_computed_tokens)

    def update_state_after_alloc(self, request: "Request",
                                 blocks: "KVCacheBlocks",
                                 num_external_tokens: int):
        self._sched.allocated(request, blocks, num_external_tokens)

    def build_connector_meta(self, scheduler_output: "SchedulerOutput"):
        return self._sched.build(scheduler_output)

    def update_connector_output(self, connector_output):
        self._sched.output(connector_output)

    def request_finished(self, request: "Request", block_ids):
        return self._sched.finished(request)

    # ---- worker side ----------------------------------------------------

    def register_kv_caches(self, kv_caches: dict[str, torch.Tensor]):
        self._worker.register(kv_caches)

    def start_load_kv(self, forward_context: "ForwardContext",
                      **kwargs: Any) -> None:
        self._worker.begin(self._get_connector_metadata())

    def wait_for_layer_load(self, layer_name: str) -> None:
        # Decode loads asynchronously: a request runs only once its room
        # is final, every layer in place.
        return

    def save_kv_layer(self, layer_name: str, kv_layer: torch.Tensor,
                      attn_metadata, **kwargs: Any) -> None:
        self._worker.layer_done(self._get_connector_metadata(),
                                extract_layer_index(layer_name))

    def wait_for_save(self):
        self._worker.step_done(self._get_connector_metadata())

    def get_finished(self, finished_req_ids: set[str]):
        r = self.get_transfer_results(finished_req_ids)
        return r.finished_sending, r.finished_recving

    def get_transfer_results(self, finished_req_ids: set[str]):
        meta = (self._get_connector_metadata()
                if self.has_connector_metadata() else None)
        return self._worker.results(finished_req_ids,
                                    meta is not None and meta.idle)

    def shutdown(self):
        if self._worker is not None:
            self._worker.close()


class _Scheduler:
    """The scheduler process's half: which requests move which blocks."""

    def __init__(self, is_producer: bool, block_size: int):
        self.is_producer = is_producer
        self.bs = block_size
        self.meta = KvtConnectorMetadata()
        # decode: request id -> tokens its prefix cache held when asked
        self.local_hit: dict[str, int] = {}
        self.receiving: set[str] = set()
        # prefill: request id -> (transfer id, prompt length, block ids)
        self.sending: dict[str, tuple[str, int, list]] = {}
        self.started: set[str] = set()

    def matched(self, request, num_computed_tokens):
        params = request.kv_transfer_params or {}
        if self.is_producer or not params.get("do_remote_prefill"):
            return 0, False
        count = len(request.prompt_token_ids) - num_computed_tokens
        if count <= 0:
            return 0, False
        self.local_hit[request.request_id] = num_computed_tokens
        return count, True

    def allocated(self, request, blocks, num_external_tokens):
        params = request.kv_transfer_params or {}
        rid = request.request_id
        if not self.is_producer and params.get("do_remote_prefill"):
            params["do_remote_prefill"] = False
            hit = self.local_hit.pop(rid, 0)
            if num_external_tokens <= 0:
                return
            if not params.get("transfer_id"):
                raise ValueError(f"request {rid}: do_remote_prefill "
                                 "without a transfer_id")
            ids = list(blocks.get_block_ids()[0])
            total = _cdiv(len(request.prompt_token_ids), self.bs)
            first = hit // self.bs
            self.meta.recv.append(_Recv(rid, params["transfer_id"],
                                        ids[first:total], first,
                                        params.get("metaserver")))
            self.receiving.add(rid)
        elif self.is_producer and params.get("do_remote_decode"):
            if not params.get("transfer_id"):
                raise ValueError(f"request {rid}: do_remote_decode "
                                 "without a transfer_id")
            self.sending[rid] = (params["transfer_id"],
                                 len(request.prompt_token_ids),
                                 list(blocks.get_block_ids()[0]))

    def build(self, so):
        meta, self.meta = self.meta, KvtConnectorMetadata()
        meta.idle = so.total_num_scheduled_tokens == 0
        if not self.is_producer or not self.sending:
            return meta
        steps = [(r.req_id, r.num_computed_tokens, r.block_ids)
                 for r in so.scheduled_new_reqs]
        cached = so.scheduled_cached_reqs
        for i, rid in enumerate(cached.req_ids):
            steps.append((rid, cached.num_computed_tokens[i],
                          cached.new_block_ids[i]))
        for rid, computed, new_ids in steps:
            if rid not in self.sending:
                continue
            tid, plen, ids = self.sending[rid]
            if rid in self.started and new_ids is not None:
                ids.extend(new_ids[0])
            elif rid not in self.started and new_ids is not None:
                ids[:] = list(new_ids[0])
            after = computed + so.num_scheduled_tokens.get(rid, 0)
            meta.send.append(_Send(rid, tid, list(ids), _cdiv(plen, self.bs),
                                   min(after, plen), plen))
            self.started.add(rid)
            if after >= plen:
                del self.sending[rid]
        return meta

    def output(self, out):
        if out is not None and not self.is_producer:
            self.receiving -= set(out.finished_recving or ())

    def finished(self, request):
        rid = request.request_id
        self.local_hit.pop(rid, None)
        if self.is_producer:
            self.sending.pop(rid, None)
            if rid in self.started:
                self.started.discard(rid)
                self.meta.release.append(rid)
                return True, None
            return False, None
        if rid in self.receiving:
            # Aborted while its KV arrives: vLLM keeps the blocks until the
            # worker reports the receive final; the worker aborts it.
            self.receiving.discard(rid)
            self.meta.release.append(rid)
        return False, None


class _Room:
    def __init__(self, room, transfer_id):
        self.room = room
        self.transfer_id = transfer_id
        self.sent = 0  # prefill: blocks attached so far
        self.last_sent = False
        self.released = False
        self.reported = False


class _Worker:
    """One rank's half: a kvt connector over this rank's KV cache."""

    def __init__(self, vllm_config, is_producer: bool, block_size: int):
        extra = vllm_config.kv_transfer_config.kv_connector_extra_config
        self.extra = dict(extra or {})
        if not self.extra.get("bootstrap_addr"):
            raise ValueError("KvtConnector: kv_connector_extra_config needs "
                             "bootstrap_addr (host:port of kvt metad)")
        self.is_producer = is_producer
        self.bs = block_size
        self.tp_rank = get_tensor_model_parallel_rank()
        self.tp_size = get_tensor_model_parallel_world_size()
        self.engine_id = vllm_config.kv_transfer_config.engine_id
        self.post_timeout = float(self.extra.get("metaserver_timeout_s", 30))
        self.mgr: Optional[KVManager] = None
        self.rooms: dict[str, _Room] = {}
        self.step: Optional[int] = None
        self.step_meta = None
        self.num_layers = 0
        self.lock = threading.Lock()
        port = self.extra.get("metrics_port")
        if port:
            # Metrics are not worth a rank: a port taken is logged.
            try:
                kvt.metrics_listen(int(port) + self.tp_rank)
            except Exception as e:  # noqa: BLE001 (OSError and kvt's)
                log.error("kvt metrics on port %d: %s",
                          int(port) + self.tp_rank, e)

    def register(self, kv_caches: dict[str, torch.Tensor]):
        caches = []
        for name, t in kv_caches.items():
            caches.append(self._describe(name, t))
        self.num_layers = len(caches)
        args = KVArgs()
        args.caches = caches
        args.tp_rank, args.tp_size = self.tp_rank, self.tp_size
        args.host = self.extra.get("host", "127.0.0.1")
        args.bootstrap_addr = self.extra["bootstrap_addr"]
        for key in ("transfer_timeout_ms", "bootstrap_timeout_ms",
                    "waiting_timeout_ms", "peer_timeout_ms",
                    "heartbeat_ms"):
            if key in self.extra:
                setattr(args, key, int(self.extra[key]))
        args.transports = self.extra.get("transports")
        mode = "prefill" if self.is_producer else "decode"
        self.mgr = KVManager(args, mode)
        log.info("kvt connector (%s, tp %d/%d) on %d layers, %s",
                 mode, self.tp_rank, self.tp_size, self.num_layers,
                 self.mgr.session_id)

    def _describe(self, name: str, t: torch.Tensor) -> KVCache:
        """vLLM's CPU attention keeps a layer as [blocks, kv_heads,
        block_size, 2 * head_size]: per head of a block, its keys then its
        values. That is kvt's KV kind, head-major, with 2 * head_size
        elements per head per token."""
        if t.device.type != "cpu" or t.dim() != 4 or not t.is_contiguous() \
                or t.shape[2] != self.bs or t.shape[3] % 2:
            raise ValueError(
                f"KvtConnector: layer {name}: KV cache of shape "
                f"{tuple(t.shape)} on {t.device} (contiguous: "
                f"{t.is_contiguous()}) is not the CPU backend's [blocks, "
                f"kv_heads, {self.bs}, 2 * head_size]")
        esz = t.element_size()
        return KVCache(layer=extract_layer_index(name), kind=CacheKind.KV,
                       ptr=t.data_ptr(), block_bytes=t.stride(0) * esz,
                       num_blocks=t.shape[0], tokens_per_block=self.bs,
                       heads=t.shape[1], head_bytes=t.shape[3] * esz,
                       block_layout=BlockLayout.HEAD_MAJOR)

    # ---- per step ----------------------------------------------------------

    def begin(self, meta: KvtConnectorMetadata):
        """Decode: open this step's receivers (start_load_kv may run
        after the forward; receiving does not depend on it)."""
        if self.is_producer:
            return
        for r in meta.recv:
            if r.req_id in self.rooms:
                continue
            room = room_of(r.transfer_id)
            rx = KVReceiver(self.mgr, self.extra["bootstrap_addr"], room)
            rx.init(r.block_ids, prefix_blocks=r.first_block)
            st = _Room(rx, r.transfer_id)
            self.rooms[r.req_id] = st
            if r.metaserver and self.tp_rank == 0:
                body = {"transfer_id": r.transfer_id, "room": room,
                        "engine_id": self.engine_id,
                        "first_block": r.first_block,
                        "num_blocks": len(r.block_ids),
                        "session": self.mgr.session_id}
                threading.Thread(target=self._post, daemon=True,
                                 args=(r.metaserver, body, rx,
                                       self.post_timeout)).start()
        self._release(meta)

    @staticmethod
    def _post(url, body, rx, timeout):
        """Tell the proxy decode is ready; if it cannot be told, nothing
        will be sent: fail the room now rather than at its timeout."""
        try:
            req = urllib.request.Request(
                url, data=json.dumps(body).encode(),
                headers={"Content-Type": "application/json"})
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                resp.read()
        except Exception as e:  # noqa: BLE001 (any failure aborts)
            log.error("transfer %s: metaserver %s: %s",
                      body["transfer_id"], url, e)
            try:
                rx.abort(f"metaserver {url}: {e}")
            except Exception:  # noqa: BLE001 (already closed)
                pass

    def _setup_step(self, meta: KvtConnectorMetadata):
        """Prefill: attach what this step completes to a kvt step."""
        if self.step_meta is meta:
            return
        self.step_meta = meta
        self.step = None
        if not meta.send:
            self._release(meta)
            return
        self.step = self.mgr.step_begin()
        for s in meta.send:
            st = self.rooms.get(s.req_id)
            if st is None:
                tx = KVSender(self.mgr, None, room_of(s.transfer_id))
                tx.init(s.total_blocks)
                st = self.rooms[s.req_id] = _Room(tx, s.transfer_id)
            if st.last_sent:
                continue
            last = s.tokens_after >= s.prompt_len
            upto = s.total_blocks if last else s.tokens_after // self.bs
            chunk = s.block_ids[st.sent:upto]
            if chunk or last:
                st.room.send_step(self.step, chunk, last)
                st.sent += len(chunk)
                st.last_sent = last
        self._release(meta)

    def layer_done(self, meta, layer: int):
        if not self.is_producer or meta is None:
            return
        self._setup_step(meta)
        if self.step is not None:
            self.mgr.layer_ready(self.step, layer)

    def step_done(self, meta):
        if not self.is_producer or meta is None:
            return
        self._setup_step(meta)
        if self.step is not None:
            self.mgr.layer_ready(self.step, self.num_layers - 1)
            self.mgr.step_end(self.step)
            self.step = None

    def _release(self, meta):
        """Requests the scheduler finished while their room was open:
        decode requests aborted while receiving, and prefill requests
        (whose blocks wait for the room). A room not final, and not just
        waiting for writes already submitted, is aborted."""
        for rid in meta.release:
            st = self.rooms.get(rid)
            if st is None:
                continue
            st.released = True
            if st.room.poll() in (KVPoll.Success, KVPoll.Failed):
                continue
            if not self.is_producer or not st.last_sent:
                st.room.abort("request finished before its transfer")

    # ---- completions ----------------------------------------------------

    def results(self, finished_req_ids, idle=False):
        """Final rooms. Decode reports each request loaded (or failed) once;
        prefill reports a request sent once the scheduler has released it
        (its blocks were kept for the transfer) and its room is final."""
        out = KVConnectorTransferResults()
        if idle:
            for st in self.rooms.values():
                if st.room.poll() not in (KVPoll.Success, KVPoll.Failed):
                    st.room.wait(IDLE_WAIT_S)  # sleeps without the GIL
                    break
        for rid, st in list(self.rooms.items()):
            state = st.room.poll()
            if state not in (KVPoll.Success, KVPoll.Failed):
                continue
            if state == KVPoll.Failed and not st.reported:
                log.error("request %s (transfer %s): KV transfer failed: %s",
                          rid, st.transfer_id, st.room.reason)
            st.reported = True
            if not self.is_producer:
                out.finished_recving.add(rid)
                if state == KVPoll.Failed:
                    out.failed_recving.add(rid)
            elif st.released:
                out.finished_sending.add(rid)
            else:
                continue
            st.room.close()
            del self.rooms[rid]
        return out

    def close(self):
        for st in self.rooms.values():
            st.room.close()
        self.rooms.clear()
        if self.mgr is not None:
            self.mgr.close()
            self.mgr = None
