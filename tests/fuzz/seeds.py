#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""Write the seed corpora of the stateful fuzz targets (fuzz_engine,
fuzz_initiator, fuzz_shm_chan) from docs/protocol.md and docs/shm.md:
   tests/fuzz/seeds.py            rewrite tests/fuzz/corpus/{engine,...}
The files are committed; run this again when a format changes."""
import os
import struct
import sys

HERE = os.path.dirname(os.path.abspath(__file__))
MAJOR, MINOR = 2, 0
HELLO, HELLO_ACK, ERROR, SEG_QUERY, SEG_DESC = 1, 2, 3, 4, 5
WRITE, WRITE_ACK, READ, READ_RESP, NOTIFY, NOTIFY_ACK, PING, PONG = range(6, 14)
# fuzz_engine's arena (offsets; the harness rebases them).
RW, RO, WO, GUARD = 8 * 1024, 28 * 1024, 40 * 1024, 0


def hdr(typ, body=b"", payload_len=0, req_id=1, status=0):
    return struct.pack("<HBBBBHIiQQ", 0x544B, MAJOR, MINOR, typ, 0, 0,
                       len(body), status, payload_len, req_id) + body


def piece(addr, length, count=1, stride=0):
    return struct.pack("<QIIQ", addr, length, count, stride)


def hello_body(sid, transport, name=b"fuzzpeer:1", index=0, nconns=1, fence=0):
    return struct.pack("<QIIII", sid, index, nconns, transport, fence) + \
        struct.pack("<H", len(name)) + name


def write(pieces, payload, req_id=1):
    body = b"".join(pieces)
    return hdr(WRITE, body, len(payload), req_id) + payload


def read(pieces, total, req_id=1):
    return hdr(READ, b"".join(pieces), total, req_id)


def save(folder, name, data):
    d = os.path.join(HERE, "corpus", folder)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def engine():
    data_hello, ctrl_hello, own = b"\x01", b"\x02", b"\x00"
    save("engine", "write", data_hello + write([piece(RW + 100, 64)],
                                               b"w" * 64))
    save("engine", "read_ro", data_hello + read([piece(RO, 128)], 128))
    save("engine", "write_ro_refused",
         data_hello + write([piece(RO, 32)], b"x" * 32))
    save("engine", "write_guard_refused",
         data_hello + write([piece(GUARD + 16, 32)], b"g" * 32))
    save("engine", "write_wo_read_refused",
         data_hello + write([piece(WO, 16)], b"o" * 16, 1) +
         read([piece(WO, 16)], 16, 2))
    save("engine", "strided", data_hello +
         write([piece(RW, 16, 4, 256)], b"s" * 64) +
         read([piece(RW, 16, 4, 256)], 64, 2))
    save("engine", "mixed_pieces", data_hello +
         write([piece(RW, 8), piece(RO, 8), piece(RW + RW, 8)], b"m" * 24))
    save("engine", "straddle", data_hello +
         write([piece(RW + 16 * 1024 - 8, 16)], b"e" * 16))
    save("engine", "notify_ping", data_hello + hdr(NOTIFY, b"room-1 ready") +
         hdr(PING, req_id=2))
    save("engine", "ctrl", ctrl_hello + hdr(SEG_QUERY) + hdr(PING, req_id=2))
    save("engine", "own_hello", own +
         hdr(HELLO, hello_body((0xbeef << 32) | 1, 1)) +
         write([piece(RW, 32)], b"h" * 32))
    save("engine", "second_hello", data_hello +
         hdr(HELLO, hello_body((0xbeef << 32) | 2, 1)))
    save("engine", "fence", own +
         hdr(HELLO, hello_body((0xf00d << 32) | 1000, 1, fence=999)) +
         hdr(PING))
    save("engine", "short_payload", data_hello +
         hdr(WRITE, piece(RW, 4096), 4096) + b"z" * 100)


AUTO, REQ_ID, CLOSE = 1, 2, 4
READ_LEN = 4096  # fuzz_initiator reads min(4096, region) bytes


def chunk(data=b"", flags=0):
    return struct.pack("<HB", len(data), flags) + data


def initiator():
    auto = chunk(flags=AUTO)
    handshake = auto + auto + auto  # control HELLO, SEG_QUERY, data HELLO
    fails = struct.pack("<Ii", 0, -13)  # piece 0: KVT_ERR_ACCESS
    trailer_ok = struct.pack("<Ii", 0, 0)
    save("initiator", "all_auto", handshake + auto * 4)
    save("initiator", "read_resp", handshake +
         chunk(hdr(READ_RESP, payload_len=READ_LEN) + b"r" * READ_LEN +
               trailer_ok, REQ_ID) + auto * 3)
    save("initiator", "read_late", handshake +
         chunk(hdr(READ_RESP, payload_len=READ_LEN) + b"l" * READ_LEN +
               struct.pack("<Ii", 1, -13), REQ_ID) + auto * 3)
    save("initiator", "read_refused", handshake +
         chunk(hdr(READ_RESP, fails, status=-13) + trailer_ok, REQ_ID) +
         auto * 3)
    save("initiator", "read_short", handshake +
         chunk(hdr(READ_RESP, payload_len=READ_LEN) + b"s" * 100, REQ_ID))
    save("initiator", "read_long", handshake +
         chunk(hdr(READ_RESP, payload_len=2 * READ_LEN) + b"L" * 2 * READ_LEN +
               trailer_ok, REQ_ID))
    save("initiator", "write_ack_fail", handshake + auto +
         chunk(hdr(WRITE_ACK, fails, status=-13), REQ_ID) + auto * 2)
    save("initiator", "write_ack_bad_index", handshake + auto +
         chunk(hdr(WRITE_ACK, struct.pack("<Ii", 7, -13), status=-13),
               REQ_ID) + auto * 2)
    save("initiator", "error", handshake +
         chunk(hdr(ERROR, b"no such region", status=-13), REQ_ID))
    save("initiator", "wrong_req_id", handshake + chunk(hdr(WRITE_ACK)))
    save("initiator", "notify_ack_status", handshake + auto * 2 +
         chunk(hdr(NOTIFY_ACK, status=-5), REQ_ID) + auto)
    save("initiator", "hello_error", chunk(hdr(ERROR, b"busy", status=-16)))
    save("initiator", "hello_version", chunk(
        struct.pack("<HBBBBHIiQQ", 0x544B, 3, 0, HELLO_ACK, 0, 0, 0, 0, 0, 1)))
    save("initiator", "desc_garbage", auto +
         chunk(hdr(SEG_DESC, payload_len=16) + b"\xff" * 16, REQ_ID))
    save("initiator", "unsolicited_pong", handshake +
         chunk(hdr(PONG) + hdr(READ_RESP, payload_len=READ_LEN), REQ_ID))
    save("initiator", "close_mid_read", handshake +
         chunk(hdr(READ_RESP, payload_len=READ_LEN) + b"c" * 10,
               REQ_ID | CLOSE) + auto * 8)


OP_MSG, OP_NOTE, OP_STAGE, OP_BELL, OP_TAIL = range(5)
SHM_MAP, SHM_BELL, SHM_IPC = 3, 5, 6


def run(raddr, data4=b"abcd", length=4, count=1, rstride=0, off=0):
    return struct.pack("<IHIHH", raddr, rstride, off, length, count) + data4


def stage(runs, op=0, slot=0, nruns=None):
    n = len(runs) if nruns is None else nruns
    return struct.pack("<BBBH", OP_STAGE, slot, op, n) + b"".join(runs)


def note(data, length=None, step=0):
    n = len(data) if length is None else length
    return struct.pack("<BIB", OP_NOTE, n, len(data)) + data + bytes([step])


def msg(typ, mode=0, status=0, ident=0, seq=0, addr=0, length=0, name=0x61):
    return struct.pack("<BBBiQQQQB", OP_MSG, typ, mode, status, ident, seq,
                       addr, length, name)


def shm_chan():
    save("shm_chan", "stage_write", stage([run(RW)]))
    save("shm_chan", "stage_read_ro", stage([run(RO)], op=1))
    save("shm_chan", "stage_write_ro_refused", stage([run(RO)]))
    save("shm_chan", "stage_write_guard_refused", stage([run(GUARD + 8)]))
    save("shm_chan", "stage_strided", stage(
        [run(RW, length=4, count=4, rstride=64), run(WO, off=16)]))
    save("shm_chan", "stage_many_slots", stage([run(RW)], slot=0) +
         stage([run(RW + 64)], slot=1) + stage([run(RO)], op=1, slot=2))
    save("shm_chan", "stage_runs_overflow", stage([run(RW)], nruns=0xffff))
    save("shm_chan", "stage_off_outside", stage([run(RW, off=0xfffffff0)]))
    save("shm_chan", "note", note(b"room-7 done"))
    save("shm_chan", "note_long", note(b"x", length=100000))
    save("shm_chan", "note_burst", note(b"a") + note(b"b") + note(b"c", step=3))
    save("shm_chan", "map", msg(SHM_MAP, mode=4, seq=1))
    save("shm_chan", "map_unknown", msg(SHM_MAP, ident=77, seq=1))
    save("shm_chan", "ipc", msg(SHM_IPC, addr=RW, seq=2))
    save("shm_chan", "bad_type", msg(99))
    save("shm_chan", "short_msg", msg(SHM_BELL, mode=2) + b"\x08")
    save("shm_chan", "tail_jump", struct.pack("<BI", OP_TAIL, 1000) +
         bytes([OP_BELL]))


def main():
    engine()
    initiator()
    shm_chan()
    return 0


if __name__ == "__main__":
    sys.exit(main())
