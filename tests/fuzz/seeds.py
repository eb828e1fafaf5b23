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


def main():
    engine()
    initiator()
    return 0


if __name__ == "__main__":
    sys.exit(main())
