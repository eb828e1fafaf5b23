# SPDX-License-Identifier: Apache-2.0
"""One process with `mooncake.engine`, whichever PYTHONPATH selects: kvt's
drop-in or Mooncake's own wheel (test_mooncake_compat.py runs every case
against both; the two cannot share a process, being the same module).

It prints one JSON line naming the module it imported, then answers one
JSON line per stdin line until stdin closes. A command is
{"exec": code} (statements run in the process's namespace, answer
{"ok": null}) or {"eval": expression} (answer {"ok": value}). A command
that raises answers {"raised": type name, "mro": [names], "msg": text}.

The namespace holds `m` (the module), `e` (a TransferEngine, not
initialized), `anon(size)` (an anonymous mapping's address, kept alive),
`peek(addr, n)` / `poke(addr, data)` (memory read and written directly,
not through the engine) and `time`. Values cross as JSON: bytes as
{"bytes": base64}, a TransferNotify as {"notify": [name, msg]}, an enum as
its int.
"""

import base64
import ctypes
import json
import mmap
import os
import sys
import time

# The protocol keeps the original stdout; anything else written there
# (a library's own prints) goes to stderr.
PROTOCOL = os.fdopen(os.dup(1), "w")
os.dup2(2, 1)

import mooncake.engine as m  # noqa: E402

KEEP = []


def anon(size):
    mp = mmap.mmap(-1, size)
    KEEP.append(mp)
    return ctypes.addressof(ctypes.c_char.from_buffer(mp))


def peek(addr, n):
    return ctypes.string_at(addr, n)


def poke(addr, data):
    ctypes.memmove(addr, data, len(data))


def enc(v):
    if isinstance(v, bool) or v is None or isinstance(v, (str, float)):
        return v
    if isinstance(v, int):
        return int(v)
    if isinstance(v, (bytes, bytearray)):
        return {"bytes": base64.b64encode(bytes(v)).decode()}
    if isinstance(v, (list, tuple)):
        return [enc(x) for x in v]
    if isinstance(v, dict):
        return {str(k): enc(x) for k, x in v.items()}
    if hasattr(v, "name") and hasattr(v, "msg"):
        return {"notify": [enc(v.name), enc(v.msg)]}
    if hasattr(v, "__int__"):
        return int(v)
    return {"repr": repr(v)}


def main():
    ns = {"m": m, "e": m.TransferEngine(), "anon": anon, "peek": peek,
          "poke": poke, "time": time}
    PROTOCOL.write(json.dumps({"module": m.__file__}) + "\n")
    PROTOCOL.flush()
    for line in sys.stdin:
        cmd = json.loads(line)
        try:
            if "exec" in cmd:
                exec(compile(cmd["exec"], "<exec>", "exec"), ns)
                out = {"ok": None}
            else:
                out = {"ok": enc(eval(cmd["eval"], ns))}
        except BaseException as ex:  # noqa: BLE001 (reported, not handled)
            out = {"raised": type(ex).__name__,
                   "mro": [c.__name__ for c in type(ex).__mro__],
                   "msg": str(ex)}
        PROTOCOL.write(json.dumps(out) + "\n")
        PROTOCOL.flush()
    return 0


if __name__ == "__main__":
    sys.exit(main())
