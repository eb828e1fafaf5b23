# SPDX-License-Identifier: Apache-2.0
"""A prefill or decode rank for test_connector.py, run as its own process.

    conn_peer.py ROLE TP_RANK TP_SIZE BOOTSTRAP MODE ROOMS [--abort] [--mla]
                 [--kv] [--tcp]

Builds a small paged K/V (or MLA) cache in ctypes memory with a random
block table, then: prefill fills it with a function of (room, layer, kind,
token, global head, byte) and sends it (MODE 'whole' or 'layer'); decode
receives it and checks every byte of every block (and the canary of the
rest). --kv: one KV cache per layer (CacheKind.KV), head-major, as vLLM's
CPU backend keeps it; --tcp: the engine uses tcp only. Exit status 0 when every room ends as expected (Success, or Failed
with --abort), 1 otherwise.
"""

import ctypes
import random
import sys
import time

from kvt.connector import (BlockLayout, CacheKind, DisaggregationMode,
                           KVArgs, KVCache, KVManager, KVPoll, KVReceiver,
                           KVSender)

LAYERS, HEADS, HEAD_BYTES, TOKENS, POOL = 3, 4, 8, 4, 48
CANARY = 0xEE


def value(room, layer, kind, token, head, byte):
    x = (room * 1000003 + layer * 10007 + kind * 101 + token * 31 +
         head * 7 + byte) * 2654435761
    return (x >> 16) & 0xFF


def main():
    role, tp_rank, tp_size, boot, mode, rooms = sys.argv[1:7]
    tp_rank, tp_size, rooms = int(tp_rank), int(tp_size), int(rooms)
    abort = "--abort" in sys.argv
    mla = "--mla" in sys.argv
    kv = "--kv" in sys.argv
    prefill = role == "prefill"
    heads = 1 if mla else HEADS // tp_size
    kinds = ([CacheKind.LATENT] if mla else [CacheKind.KV] if kv else
             [CacheKind.K, CacheKind.V])
    order = BlockLayout.HEAD_MAJOR if kv else BlockLayout.TOKEN_MAJOR
    block = TOKENS * heads * HEAD_BYTES

    def off(t, h):
        """A (token, head) piece's place in a block."""
        if kv:
            return (h * TOKENS + t) * HEAD_BYTES
        return (t * heads + h) * HEAD_BYTES

    bufs, caches = [], []
    for layer in range(LAYERS):
        for kind in kinds:
            b = (ctypes.c_uint8 * (block * POOL))()
            if not prefill:
                ctypes.memset(b, CANARY, len(b))
            bufs.append((layer, kind, b))
            caches.append(KVCache(layer, kind, ctypes.addressof(b), block,
                                  POOL, TOKENS, heads, HEAD_BYTES, order))
    aux = (ctypes.c_uint8 * (16 * rooms))()
    if not prefill:
        ctypes.memset(aux, CANARY, len(aux))

    args = KVArgs()
    args.caches = caches
    args.num_layers = LAYERS
    args.aux_data_ptrs = [ctypes.addressof(aux)]
    args.aux_data_lens = [len(aux)]
    args.aux_item_lens = [16]
    args.tp_rank, args.tp_size = tp_rank, tp_size
    args.bootstrap_addr = boot
    args.heartbeat_ms, args.peer_timeout_ms = 100, 2000
    if "--tcp" in sys.argv:
        args.transports = "tcp"
    mgr = KVManager(args, DisaggregationMode.PREFILL if prefill else
                    DisaggregationMode.DECODE)

    rng = random.Random(1000 * prefill + tp_rank)
    pool = list(range(POOL))
    rng.shuffle(pool)
    tables = [[pool.pop() for _ in range(5)] for _ in range(rooms)]

    def gh(h):
        return h if mla else tp_rank * heads + h

    def fill(r, layer):
        for (lyr, kind, b) in bufs:
            if lyr != layer:
                continue
            for lb, blk in enumerate(tables[r]):
                for t in range(TOKENS):
                    for h in range(heads):
                        for x in range(HEAD_BYTES):
                            b[blk * block + off(t, h) + x] = value(
                                100 + r, lyr, kind, lb * TOKENS + t, gh(h), x)

    objs = []
    if prefill:
        for r in range(rooms):
            s = KVSender(mgr, boot, 100 + r)
            s.init(5, r)
            aux[16 * r:16 * r + 16] = bytes([r + 1] * 16)
            objs.append(s)
        if abort:
            pass  # decode aborts; nothing is sent
        elif mode == "whole":
            for r in range(rooms):
                for layer in range(LAYERS):
                    fill(r, layer)
                objs[r].send(tables[r][:2])
                objs[r].send(tables[r][2:])
        else:
            step = mgr.step_begin()
            for r in range(rooms):
                objs[r].send_step(step, tables[r])
            for layer in range(LAYERS):
                for r in range(rooms):
                    fill(r, layer)
                mgr.layer_ready(step, layer)
            mgr.step_end(step)
    else:
        for r in range(rooms):
            rcv = KVReceiver(mgr, boot, 100 + r)
            rcv.init(tables[r], rooms - 1 - r)
            objs.append(rcv)
        if abort:
            time.sleep(0.2)
            for o in objs:
                o.abort("test abort")

    want = KVPoll.Failed if abort else KVPoll.Success
    ok = True
    for o in objs:
        state = o.wait(15)
        if state != want:
            print(f"{role} {tp_rank} room {o.bootstrap_room}: {o.info()}",
                  file=sys.stderr)
            ok = False
        if state == KVPoll.Failed and not abort:
            try:
                o.failure_exception()
            except Exception as e:  # the reason, for the log
                print(e, file=sys.stderr)

    if ok and not prefill and not abort:
        owned = {blk: (r, lb) for r in range(rooms)
                 for lb, blk in enumerate(tables[r])}
        for (lyr, kind, b) in bufs:
            data = bytes(b)
            for blk in range(POOL):
                got = data[blk * block:(blk + 1) * block]
                if blk not in owned:
                    ok &= got == bytes([CANARY]) * block
                    continue
                r, lb = owned[blk]
                want_b = bytearray(block)
                for t in range(TOKENS):
                    for h in range(heads):
                        for x in range(HEAD_BYTES):
                            want_b[off(t, h) + x] = value(
                                100 + r, lyr, kind, lb * TOKENS + t, gh(h), x)
                if got != want_b:
                    print(f"layer {lyr} kind {kind} block {blk} differs",
                          file=sys.stderr)
                    ok = False
        for r in range(rooms):
            slot = rooms - 1 - r
            if bytes(aux[16 * slot:16 * slot + 16]) != bytes([r + 1] * 16):
                print(f"aux of room {r} differs", file=sys.stderr)
                ok = False
    print("ready", flush=True)
    sys.stdin.read()  # the test closes stdin once every peer is done
    for o in objs:
        o.close()
    mgr.close()
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
