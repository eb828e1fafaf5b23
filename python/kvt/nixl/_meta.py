# SPDX-License-Identifier: Apache-2.0
"""Agent metadata for kvt's NIXL agent: its format, the listener exchange
and the etcd exchange.

The metadata blob is kvt's own, versioned: ``KVTNIXL`` and a version
byte, then JSON (the agent's name, its kvt segment name ``host:port``
when connection info is included, and its registered regions). A blob of
another format (the real NIXL's, or a later version) is refused with a
clear error, never half-read.

The listener speaks a small length-prefixed protocol over TCP, one request
per connection: ``KVNL``, an opcode byte (``S`` take this metadata, ``F``
send me yours for this name, ``I`` forget this agent), a 4-byte big-endian
length and the payload. Every socket operation has a timeout.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import socket
import struct
import threading
import urllib.error
import urllib.request

from . import _bindings as B

# NIXL callers watch the "nixl" logger (nixl.logging); kvt logs there.
log = logging.getLogger("nixl")

MAGIC = b"KVTNIXL"
VERSION = 1
MAX_BLOB = 64 << 20
NET_TIMEOUT = 5.0
_REQ = b"KVNL"


def encode(name, segment, regions):
    """The blob: @regions are (addr, len, dev, mem_type) tuples; @segment
    may be None (partial metadata without connection info)."""
    body = {"name": name, "segment": segment,
            "regions": [[int(a), int(n), int(d), int(m)]
                        for a, n, d, m in regions]}
    return MAGIC + bytes([VERSION]) + json.dumps(body).encode()


def decode(blob):
    """(name, segment or None, regions) of a blob; nixlInvalidParamError
    (or nixlMismatchError for another version) when it is not one."""
    if not isinstance(blob, (bytes, bytearray, memoryview)):
        raise B.nixlInvalidParamError("metadata must be bytes")
    blob = bytes(blob)
    if not blob.startswith(MAGIC) or len(blob) <= len(MAGIC):
        raise B.nixlInvalidParamError(
            "not kvt's NIXL agent metadata (a blob of the real NIXL, or "
            "another format? both sides must run the same implementation)")
    ver = blob[len(MAGIC)]
    if ver != VERSION:
        raise B.nixlMismatchError(
            "kvt NIXL metadata version %d; this kvt speaks version %d"
            % (ver, VERSION))
    try:
        body = json.loads(blob[len(MAGIC) + 1:])
        name = body["name"]
        seg = body["segment"]
        regions = [tuple(int(x) for x in r) for r in body["regions"]]
    except (ValueError, KeyError, TypeError, OverflowError,
            RecursionError) as e:
        raise B.nixlInvalidParamError("corrupt kvt NIXL metadata: %s" % e)
    if not isinstance(name, str) or not name:
        raise B.nixlInvalidParamError("corrupt kvt NIXL metadata: name")
    for r in regions:
        if len(r) != 4 or not all(0 <= x < 1 << 64 for x in r) or \
                r[0] + r[1] > 1 << 64:
            raise B.nixlInvalidParamError("corrupt kvt NIXL metadata: "
                                          "region %r" % (r,))
    if seg is not None and not isinstance(seg, str):
        raise B.nixlInvalidParamError("corrupt kvt NIXL metadata: segment")
    return name, seg, regions


# ---- The listener ----------------------------------------------------------


def _recv_exact(sock, n):
    buf = bytearray()
    while len(buf) < n:
        chunk = sock.recv(n - len(buf))
        if not chunk:
            raise ConnectionError("peer closed the connection")
        buf += chunk
    return bytes(buf)


def request(host, port, op, payload, want_reply):
    """One request to a peer's listener; its reply's payload (or b"")."""
    with socket.create_connection((host, port), timeout=NET_TIMEOUT) as s:
        s.settimeout(NET_TIMEOUT)
        s.sendall(_REQ + op + struct.pack(">I", len(payload)) + payload)
        if not want_reply:
            return b""
        (n,) = struct.unpack(">I", _recv_exact(s, 4))
        if n > MAX_BLOB:
            raise ConnectionError("reply of %d bytes is too long" % n)
        return _recv_exact(s, n)


class Listener:
    """The agent's listener thread: answers the requests above with the
    agent's callbacks (take, give, forget)."""

    def __init__(self, host, port, take, give, forget):
        self._take, self._give, self._forget = take, give, forget
        self._sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        self._sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        self._sock.bind((host, port))
        self._sock.listen(64)
        self._sock.settimeout(0.2)
        self.port = self._sock.getsockname()[1]
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True,
                                        name="kvt-nixl-listen")
        self._thread.start()

    def _run(self):
        while not self._stop.is_set():
            try:
                conn, _ = self._sock.accept()
            except socket.timeout:
                continue
            except OSError:
                return
            with conn:
                try:
                    self._serve(conn)
                except Exception as e:  # noqa: BLE001 (one request's end)
                    log.warning("nixl listener: request refused: %s: %s",
                                type(e).__name__, e)

    def _serve(self, conn):
        conn.settimeout(NET_TIMEOUT)
        head = _recv_exact(conn, 9)
        if head[:4] != _REQ:
            raise ValueError("not a kvt nixl request")
        op = head[4:5]
        (n,) = struct.unpack(">I", head[5:9])
        if n > MAX_BLOB:
            raise ValueError("request of %d bytes is too long" % n)
        payload = _recv_exact(conn, n)
        if op == b"S":
            self._take(payload)
        elif op == b"F":
            blob = self._give(payload.decode())
            conn.sendall(struct.pack(">I", len(blob)) + blob)
        elif op == b"I":
            self._forget(payload.decode())
        else:
            raise ValueError("unknown request %r" % op)

    def close(self):
        self._stop.set()
        self._sock.close()
        self._thread.join(timeout=2)


# ---- etcd (its v3 JSON gateway) -------------------------------------------


class Etcd:
    """Metadata under NIXL_ETCD_NAMESPACE (default /nixl/agents) in the
    etcd of NIXL_ETCD_ENDPOINTS (the first reachable endpoint)."""

    def __init__(self, endpoints):
        self.endpoints = [e.strip().rstrip("/") for e in endpoints.split(",")
                          if e.strip()]
        self.endpoints = [e if "://" in e else "http://" + e
                          for e in self.endpoints]
        self.ns = os.environ.get("NIXL_ETCD_NAMESPACE", "/nixl/agents")
        self.ns = self.ns.rstrip("/")

    def key(self, agent, label=""):
        return "%s/%s/%s" % (self.ns, agent, label or "metadata")

    def _call(self, path, body):
        data = json.dumps(body).encode()
        err = None
        for ep in self.endpoints:
            req = urllib.request.Request(ep + path, data=data, headers={
                "Content-Type": "application/json"})
            try:
                with urllib.request.urlopen(req, timeout=NET_TIMEOUT) as r:
                    return json.loads(r.read())
            except (OSError, urllib.error.URLError, ValueError) as e:
                err = e
        raise B.nixlBackendError("etcd at %s: %s" % (",".join(self.endpoints),
                                                     err))

    @staticmethod
    def _b64(b):
        return base64.b64encode(b).decode()

    def put(self, key, value):
        self._call("/v3/kv/put", {"key": self._b64(key.encode()),
                                  "value": self._b64(value)})

    def get(self, key):
        r = self._call("/v3/kv/range", {"key": self._b64(key.encode())})
        kvs = r.get("kvs") or []
        if not kvs:
            return None
        return base64.b64decode(kvs[0].get("value", ""))

    def delete_prefix(self, prefix):
        k = prefix.encode()
        end = k[:-1] + bytes([k[-1] + 1])
        self._call("/v3/kv/deleterange", {"key": self._b64(k),
                                          "range_end": self._b64(end)})
