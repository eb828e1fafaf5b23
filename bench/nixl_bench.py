# SPDX-License-Identifier: Apache-2.0
"""One measurement through NIXL's agent API, two processes: an initiator
and a target, whichever `nixl` the interpreter imports (kvt's package, or
NIXL's wheel first on PYTHONPATH). bench/nixl-bench runs it for each
implementation and prints the table.

    python bench/nixl_bench.py PATTERN OP   (the initiator; it starts the
                                             target itself)

PATTERN vllm: a prepared list of 16 KiB blocks (16384 of them, 256 MiB),
transfers of 256 random blocks (random on both sides, as vLLM's block
tables are), one notification each. PATTERN mib: 1 MiB blocks (256 of
them), transfers of 64 random blocks, one notification each. OP READ or
WRITE. Up to WINDOW transfers are in flight; each is polled with
check_xfer_state, as vLLM does.

Prints one JSON line: bytes moved, seconds, GB/s, CPU seconds of both
processes (user + system) per GB, and the median and p90 latency of a
notification, measured apart, after the throughput phase: LAT_N transfers
of one block each, one at a time, from the transfer's post at the
initiator to the notification's arrival at the target (both on
CLOCK_MONOTONIC, one clock for the machine).
"""

import json
import os
import resource
import subprocess
import sys
import time

import numpy as np
from nixl._api import nixl_agent, nixl_agent_config

PATTERNS = {"vllm": (16 << 10, 16384, 256), "mib": (1 << 20, 256, 64)}
WINDOW = 4
SECONDS = float(os.environ.get("NIXL_BENCH_SECONDS", "3"))
WARMUP = 20
LAT_N = 200


def cpu_seconds():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def agent(name):
    # The progress thread as vLLM's NixlConnector leaves it (on), unless
    # NIXL_BENCH_PROG_THREAD=0.
    prog = os.environ.get("NIXL_BENCH_PROG_THREAD", "1") != "0"
    return nixl_agent(name, nixl_agent_config(enable_prog_thread=prog,
                                              backends=["UCX"]))


def region(nbytes):
    buf = np.ones(nbytes, dtype=np.uint8)  # touched: no first-touch cost
    return buf


def report(obj):
    """A line for the other process (NIXL's log shares the pipe)."""
    print("@@" + json.dumps(obj), flush=True)


def answer(proc):
    """The target's next report."""
    while True:
        line = proc.stdout.readline()
        if not line:
            raise RuntimeError("the target process ended")
        if line.startswith("@@"):
            return json.loads(line[2:])


def target(pattern):
    bs, nblocks, _ = PATTERNS[pattern]
    ag = agent("target")
    buf = region(bs * nblocks)
    ag.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    report({"md": ag.get_agent_metadata().hex(), "addr": buf.ctypes.data})
    peer = bytes.fromhex(sys.stdin.readline().strip())
    ag.add_remote_agent(peer)
    arrivals = {}
    cpu0 = cpu_seconds()  # reset when the first measured one arrives
    done = False
    while not done:
        got = ag.get_new_notifs()
        now = time.monotonic()
        for msgs in got.values():
            for m in msgs:
                if m == b"end":
                    done = True
                elif m.startswith(b"l"):
                    arrivals["l%d" % int(m[1:])] = now
                else:
                    k = int(m[1:])
                    arrivals[k] = now
                    if k == WARMUP:
                        cpu0 = cpu_seconds()
        if not got:
            time.sleep(20e-6)
    report({"arrivals": arrivals, "cpu": cpu_seconds() - cpu0})


def initiator(pattern, op):
    bs, nblocks, per_xfer = PATTERNS[pattern]
    proc = subprocess.Popen([sys.executable, __file__, "--target", pattern],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                            text=True)
    try:
        return _initiate(proc, pattern, op, bs, nblocks, per_xfer)
    finally:
        try:
            proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()


def _initiate(proc, pattern, op, bs, nblocks, per_xfer):
    info = answer(proc)
    ag = agent("initiator")
    buf = region(bs * nblocks)
    ag.register_memory([(buf.ctypes.data, buf.nbytes, 0, "")], "DRAM")
    remote = ag.add_remote_agent(bytes.fromhex(info["md"]))
    proc.stdin.write(ag.get_agent_metadata().hex() + "\n")
    proc.stdin.flush()
    local = ag.prep_xfer_dlist("NIXL_INIT_AGENT", np.array(
        [(buf.ctypes.data + i * bs, bs, 0) for i in range(nblocks)],
        dtype=np.uint64), "DRAM")
    far = ag.prep_xfer_dlist(remote, np.array(
        [(info["addr"] + i * bs, bs, 0) for i in range(nblocks)],
        dtype=np.uint64), "DRAM")
    rng = np.random.default_rng(1)
    posted, inflight = {}, []
    n = 0
    t_start = cpu0 = None
    deadline = None
    while True:
        if n == WARMUP:
            while inflight:  # the warm-up ends with nothing in flight
                h, _ = inflight.pop(0)
                while ag.check_xfer_state(h) != "DONE":
                    pass
                ag.release_xfer_handle(h)
            t_start, cpu0 = time.monotonic(), cpu_seconds()
            deadline = t_start + SECONDS
            first = n
        if deadline is not None and time.monotonic() >= deadline:
            break
        if len(inflight) < WINDOW:
            li = rng.choice(nblocks, per_xfer, replace=False)
            ri = rng.choice(nblocks, per_xfer, replace=False)
            h = ag.make_prepped_xfer(op, local, li, far, ri, b"n%d" % n)
            posted[n] = time.monotonic()
            ag.transfer(h)
            inflight.append((h, n))
            n += 1
            continue
        still = []
        for h, k in inflight:
            if ag.check_xfer_state(h) == "DONE":
                ag.release_xfer_handle(h)
            else:
                still.append((h, k))
        inflight = still
    for h, k in inflight:
        while ag.check_xfer_state(h) != "DONE":
            pass
        ag.release_xfer_handle(h)
    elapsed = time.monotonic() - t_start
    cpu = cpu_seconds() - cpu0
    lposted = {}
    for j in range(LAT_N):
        li = rng.choice(nblocks, 1)
        ri = rng.choice(nblocks, 1)
        h = ag.make_prepped_xfer(op, local, li, far, ri, b"l%d" % j)
        lposted[j] = time.monotonic()
        ag.transfer(h)
        while ag.check_xfer_state(h) != "DONE":
            pass
        ag.release_xfer_handle(h)
    ag.send_notif(b"target", b"end")
    rep = answer(proc)
    count = n - first
    nbytes = count * per_xfer * bs
    lat = sorted(rep["arrivals"]["l%d" % j] - lposted[j]
                 for j in range(LAT_N) if "l%d" % j in rep["arrivals"])
    got = sum(1 for k in range(first, n) if str(k) in rep["arrivals"])
    gb = nbytes / 1e9
    return {"pattern": pattern, "op": op, "transfers": count,
            "bytes": nbytes, "seconds": elapsed, "gbps": gb / elapsed,
            "cpu_per_gb": (cpu + rep["cpu"]) / gb,
            "notifs": got, "notifs_expected": n - first,
            "notif_p50_us": lat[len(lat) // 2] * 1e6 if lat else None,
            "notif_p90_us": lat[len(lat) * 9 // 10] * 1e6 if lat else None}


if __name__ == "__main__":
    if sys.argv[1] == "--target":
        target(sys.argv[2])
    else:
        print(json.dumps(initiator(sys.argv[1], sys.argv[2])), flush=True)
