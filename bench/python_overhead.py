# SPDX-License-Identifier: Apache-2.0
"""What the Python binding costs on top of kvt's C API, measured in one run.

A `kvt bench` target serves a 256 MiB buffer on 127.0.0.1. Against it, in
turn:

1. per-call latency of a synchronous 4 KiB write: `kvt bench` (C API,
   batch of one, one thread) vs. TransferEngine.transfer_sync_write;
2. throughput of 32 x 1 MiB synchronous batches: `kvt bench` vs.
   TransferEngine.batch_transfer_sync_write.

Both sides walk through the target's buffer the same way and use the same
engine settings (tcp only, 2 workers, 2 connections per peer). Each side gets
--duration seconds per figure, cut into --rounds slices that alternate
C, Python, C, Python, ..., so that load from other processes on a shared
machine falls on both sides alike; each side keeps its best slice. The
script prints both figures and their ratio for each, against the bars:
Python per call <= 1.5 x C, Python batch throughput >= 90 % of C.
Figures, not pass/fail: the exit status is 0 whenever the measurements
ran.

Usage (from the repository root, after `make`):
    python3 bench/python_overhead.py [--duration=3] [--rounds=3] [--json]
"""

import argparse
import ctypes
import json
import mmap
import os
import pathlib
import re
import statistics
import subprocess
import sys
import time

ROOT = pathlib.Path(__file__).resolve().parent.parent
try:
    import kvt  # noqa: F401
except ImportError:
    sys.path.insert(0, str(ROOT / "build" / "python"))
from mooncake.engine import TransferEngine  # noqa: E402

KiB, MiB = 1 << 10, 1 << 20
TARGET_BUFFER = 256 * MiB


def start_target(kvt_bin):
    proc = subprocess.Popen(
        [kvt_bin, "bench", "--mode=target", "--local=127.0.0.1",
         f"--buffer-size={TARGET_BUFFER // MiB}M", "--protocol=tcp"],
        stdout=subprocess.PIPE, text=True)
    for line in proc.stdout:
        m = re.match(r"segment: (\S+)", line)
        if m:
            return proc, m.group(1)
    proc.wait()
    raise RuntimeError(f"kvt bench target exited with {proc.returncode}")


def c_bench(kvt_bin, segment, block, batch, duration):
    out = subprocess.run(
        [kvt_bin, "bench", "--mode=initiator", f"--segment={segment}",
         f"--block-size={block}", f"--batch-size={batch}", "--threads=1",
         f"--duration={duration}", "--protocol=tcp", "--json"],
        capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def local_buffer(engine, size):
    m = mmap.mmap(-1, size)
    for off in range(0, size, 4096):  # fault pages in before timing
        m[off] = 1
    addr = ctypes.addressof(ctypes.c_char.from_buffer(m))
    if engine.register_memory(addr, size) != 0:
        raise RuntimeError("register_memory failed")
    return m, addr


def py_sync_4k(engine, segment, local, remote, duration):
    """Per-call latencies (us) of transfer_sync_write of 4 KiB, walking
    the remote buffer in 4 KiB steps as kvt bench does."""
    windows = TARGET_BUFFER // (4 * KiB)
    write = engine.transfer_sync_write
    clock = time.perf_counter_ns
    lat = []
    i = 0
    end = time.monotonic() + duration
    while time.monotonic() < end:
        dst = remote + (i % windows) * 4 * KiB
        t0 = clock()
        rc = write(segment, local, dst, 4 * KiB)
        lat.append((clock() - t0) / 1000.0)
        if rc != 0:
            raise RuntimeError("transfer_sync_write failed")
        i += 1
    return lat


def py_batch_1m(engine, segment, local, remote, duration):
    """GB/s of batch_transfer_sync_write of 32 x 1 MiB."""
    span = 32 * MiB
    windows = TARGET_BUFFER // span
    srcs = [local + k * MiB for k in range(32)]
    lens = [MiB] * 32
    dsts = [[remote + w * span + k * MiB for k in range(32)]
            for w in range(windows)]
    write = engine.batch_transfer_sync_write
    moved = 0
    i = 0
    t0 = time.monotonic()
    end = t0 + duration
    while time.monotonic() < end:
        if write(segment, srcs, dsts[i % windows], lens) != 0:
            raise RuntimeError("batch_transfer_sync_write failed")
        moved += span
        i += 1
    return moved / (time.monotonic() - t0) / 1e9


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--kvt", default=str(ROOT / "build" / "bin" / "kvt"),
                    help="the kvt command (default: build/bin/kvt)")
    ap.add_argument("--duration", type=float, default=3.0,
                    help="seconds per side and figure (default 3)")
    ap.add_argument("--rounds", type=int, default=3,
                    help="slices the duration is cut into, alternating C "
                         "and Python; each side keeps its best (default 3)")
    ap.add_argument("--json", action="store_true",
                    help="also print the results as one JSON line")
    args = ap.parse_args()

    target, segment = start_target(args.kvt)
    try:
        engine = TransferEngine()
        if engine.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") != 0:
            raise RuntimeError("initialize failed")
        remote = engine.get_first_buffer_address(segment)
        if remote == 0:
            raise RuntimeError(f"no registered buffer at {segment}")
        _m1, local4k = local_buffer(engine, 4 * KiB)
        _m2, local32m = local_buffer(engine, 32 * MiB)
        # Warm up: sessions open, pools filled, code paged in.
        py_sync_4k(engine, segment, local4k, remote, 0.2)
        py_batch_1m(engine, segment, local32m, remote, 0.2)

        c_p50, py_p50, py_mean, c_gbps, py_gbps = [], [], [], [], []
        slice_s = args.duration / args.rounds
        for _ in range(args.rounds):
            c = c_bench(args.kvt, segment, "4K", 1, slice_s)
            c_p50.append(c["lat_p50_us"])
            lat = py_sync_4k(engine, segment, local4k, remote, slice_s)
            py_p50.append(statistics.median(lat))
            py_mean.append(statistics.fmean(lat))
        for _ in range(args.rounds):
            c = c_bench(args.kvt, segment, "1M", 32, slice_s)
            c_gbps.append(c["gbps"])
            py_gbps.append(py_batch_1m(engine, segment, local32m, remote,
                                       slice_s))
    finally:
        target.terminate()
        target.wait(10)

    res = {
        "c_sync_4k_p50_us": min(c_p50),
        "py_sync_4k_p50_us": min(py_p50),
        "py_sync_4k_mean_us": min(py_mean),
        "c_batch_32x1m_gbps": max(c_gbps),
        "py_batch_32x1m_gbps": max(py_gbps),
    }
    res["sync_4k_ratio"] = res["py_sync_4k_p50_us"] / res["c_sync_4k_p50_us"]
    res["batch_ratio"] = res["py_batch_32x1m_gbps"] / res["c_batch_32x1m_gbps"]

    def verdict(ok):
        return "within bar" if ok else "MISSES bar"

    print(f"python_overhead: loopback tcp, target {segment}, "
          f"{args.duration:g} s per side and figure in {args.rounds} "
          f"alternating slice(s), "
          f"CPython {sys.version.split()[0]}")
    print(f"  sync write 4 KiB, per call (p50): C {res['c_sync_4k_p50_us']:.1f}"
          f" us, Python {res['py_sync_4k_p50_us']:.1f} us (mean "
          f"{res['py_sync_4k_mean_us']:.1f} us); ratio "
          f"{res['sync_4k_ratio']:.2f}x (bar <= 1.50x: "
          f"{verdict(res['sync_4k_ratio'] <= 1.5)})")
    print(f"  batch write 32 x 1 MiB: C {res['c_batch_32x1m_gbps']:.3f} GB/s,"
          f" Python {res['py_batch_32x1m_gbps']:.3f} GB/s; ratio "
          f"{100 * res['batch_ratio']:.1f}% (bar >= 90%: "
          f"{verdict(res['batch_ratio'] >= 0.9)})")
    if args.json:
        print(json.dumps(res))
    return 0


if __name__ == "__main__":
    sys.exit(main())
