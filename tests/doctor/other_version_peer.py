#!/usr/bin/env python3
# SPDX-License-Identifier: Apache-2.0
"""A peer that speaks another major version of kvt's wire protocol (3.0),
as a future kvt would answer this one: every connection's first message
(HELLO) is refused with ERROR / KVT_ERR_VERSION in a 3.0 header
(docs/protocol.md, "Header"). Usage: other_version_peer.py HOST PORT."""
import socket
import struct
import sys

MAGIC = 0x544B
ERROR = 3
ERR_VERSION = -14


def header(major, minor, typ, body_len, status):
    # magic u16, major u8, minor u8, type u8, flags u8, reserved u16,
    # body_len u32, status i32, payload_len u64, req_id u64; little-endian.
    return struct.pack("<HBBBBHIiQQ", MAGIC, major, minor, typ, 0, 0,
                       body_len, status, 0, 0)


def main():
    host, port = sys.argv[1], int(sys.argv[2])
    srv = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    srv.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    srv.bind((host, port))
    srv.listen(16)
    print("listening", flush=True)
    while True:
        c, _ = srv.accept()
        with c:
            c.settimeout(5)
            try:
                hdr = b""
                while len(hdr) < 32:
                    chunk = c.recv(32 - len(hdr))
                    if not chunk:
                        break
                    hdr += chunk
                if len(hdr) < 32:
                    continue
                body_len = struct.unpack_from("<I", hdr, 8)[0]
                left = body_len
                while left > 0:
                    chunk = c.recv(min(left, 65536))
                    if not chunk:
                        break
                    left -= len(chunk)
                reason = b"kvt protocol 3.0 only"
                c.sendall(header(3, 0, ERROR, len(reason), ERR_VERSION) +
                          reason)
            except OSError:
                pass


if __name__ == "__main__":
    main()
