# SPDX-License-Identifier: Apache-2.0
"""Target process for the binding's tests.

It uses kvt through the Mooncake drop-in (``mooncake.engine``), exposes
memory in every way the API allows, prints one JSON line describing it
(segment name, addresses), then serves until killed, answering one JSON
command per stdin line with one JSON line on stdout. The commands let a
test inspect and change the target's memory from the outside, so every
transfer can be checked byte for byte on both sides.
"""

import argparse
import base64
import ctypes
import json
import mmap
import sys
import time

from mooncake.engine import TransferEngine, TransferNotify

MiB = 1 << 20


def address_of(buf):
    return ctypes.addressof(ctypes.c_char.from_buffer(buf))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--metadata", default="P2PHANDSHAKE")
    ap.add_argument("--protocol", default="tcp")
    args = ap.parse_args()
    host = args.host
    engine = TransferEngine()
    if engine.initialize(host, args.metadata, args.protocol, "") != 0:
        print(json.dumps({"error": "initialize failed"}), flush=True)
        return 1

    keep = []  # mappings must outlive their registration

    def anon(size):
        m = mmap.mmap(-1, size)
        keep.append(m)
        return address_of(m)

    managed = engine.allocate_managed_buffer(4 * MiB)
    reg = anon(4 * MiB)
    batch = [anon(64 * 1024), anon(64 * 1024)]
    unreg = anon(64 * 1024)  # never registered
    rcs = [
        0 if managed else -1,
        engine.register_memory(reg, 4 * MiB),
        engine.batch_register_memory(batch, [64 * 1024, 64 * 1024]),
    ]
    info = {
        "segment": f"{host}:{engine.get_rpc_port()}",
        "rpc_port": engine.get_rpc_port(),
        "managed": managed,
        "managed_len": 4 * MiB,
        "reg": reg,
        "reg_len": 4 * MiB,
        "batch": batch,
        "batch_len": 64 * 1024,
        "unreg": unreg,
        "unreg_len": 64 * 1024,
        "rcs": rcs,
    }
    print(json.dumps(info), flush=True)

    for line in sys.stdin:
        cmd = json.loads(line)
        op = cmd["cmd"]
        if op == "read":
            data = engine.read_bytes_from_buffer(cmd["addr"], cmd["len"])
            out = {"data": base64.b64encode(data).decode()}
        elif op == "fill":
            data = base64.b64decode(cmd["data"])
            out = {"rc": engine.write_bytes_to_buffer(cmd["addr"], data,
                                                      len(data))}
        elif op == "register":
            out = {"rc": engine.register_memory(cmd["addr"], cmd["len"])}
        elif op == "unregister":
            out = {"rc": engine.unregister_memory(cmd["addr"])}
        elif op == "notifies":
            # Wait (bounded) for at least `min` notifications.
            got = []
            deadline = time.monotonic() + cmd.get("timeout", 5.0)
            while True:
                got += [[n.name, n.msg] for n in engine.get_notifies()]
                if len(got) >= cmd.get("min", 0) or \
                        time.monotonic() > deadline:
                    break
                time.sleep(0.01)
            # With check_addr, report the memory as it was when the
            # notifications were seen: it must already hold the data.
            out = {"notifies": got}
            if "check_addr" in cmd:
                data = engine.read_bytes_from_buffer(cmd["check_addr"],
                                                     cmd["check_len"])
                out["data"] = base64.b64encode(data).decode()
        elif op == "notify":
            rc = engine.send_notify(cmd["target"],
                                    TransferNotify(cmd["name"], cmd["msg"]))
            out = {"rc": rc}
        elif op == "quit":
            print(json.dumps({"bye": True}), flush=True)
            break
        else:
            out = {"error": f"unknown command {op}"}
        print(json.dumps(out), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
