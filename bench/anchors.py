# SPDX-License-Identifier: Apache-2.0
"""kvt beside the real Mooncake Transfer Engine: one benchmark written
against the ``mooncake.engine`` API, run on Mooncake's wheel and on kvt's
drop-in (bench/anchors sets up the interpreter and runs this file).

Three kinds of process, all on 127.0.0.1:

  driver     anchors.py [options]: starts one initiator per engine and
             configuration, sends each the rows to run in turn (kvt,
             Mooncake, kvt, ...; the first engine alternates by round),
             prints the medians, the ratios and one JSON line per row.
  initiator  anchors.py --initiator ENGINE PROTOCOL: imports
             mooncake.engine, checks it is ENGINE's, starts its target,
             runs the rows it is sent (one JSON line each).
  target     anchors.py --target PROTOCOL: serves 1 GiB; fills it with a
             pattern or checks written blocks when the initiator asks.

Both sides hold a 1 GiB buffer (anonymous mmap, filled before use, so
every page is touched). A row walks the whole buffer: descriptor j moves
local slot L[j] to or from remote slot R[j] (R a random permutation of
the remote slots, L the identity, or a permutation for the request row),
j cycling over all the slots. Every 8-byte word of a source holds its
word index plus the row's seed; after a row the destination is checked
against that (writes at the target, reads at the initiator): all the
blocks moved, or a random sample of them (--verify N).
"""

import argparse
import json
import mmap
import os
import queue
import resource
import signal
import statistics
import subprocess
import sys
import threading
import time

import numpy as np

SIZE = 1 << 30  # each side's buffer
HERE = os.path.abspath(__file__)
CLK = os.sysconf("SC_CLK_TCK")

# name: (op, block size, descriptors a call, batches in flight)
#   op: write/read (batch_transfer_async_*, get_batch_transfer_status),
#   sync (transfer_sync_write, one at a time), request
#   (batch_transfer_sync_write, one call a request).
K = 1 << 10
M = 1 << 20
ROWS = {
    "write-4K-scatter": ("write", 4 * K, 128, 2),
    "write-16K-scatter": ("write", 16 * K, 128, 2),
    "write-64K-scatter": ("write", 64 * K, 128, 2),
    "write-1M": ("write", M, 32, 2),
    "write-16M": ("write", 16 * M, 4, 2),
    "read-4K-scatter": ("read", 4 * K, 128, 2),
    "read-16K-scatter": ("read", 16 * K, 128, 2),
    "read-64K-scatter": ("read", 64 * K, 128, 2),
    "read-1M": ("read", M, 32, 2),
    "read-16M": ("read", 16 * M, 4, 2),
    "sync-write-4K": ("sync", 4 * K, 1, 1),
    "llama8b-request": ("request", 16 * K, 32 * 2 * 64, 1),
}
QUICK_ROWS = ["write-4K-scatter", "write-64K-scatter", "write-1M", "read-1M"]
# configuration: (kvt's protocol, Mooncake's protocol)
CONFIGS = {
    "tcp": ("tcp", "tcp"),
    # kvt's "shm" (like "") lets it choose per peer among all its
    # transports: shm for a same-host one ("rdma" would mean ucx and tcp).
    # Mooncake's wheel has no same-host transport for host memory; without
    # RDMA devices every protocol it accepts installs its TcpTransport
    # here, so its best path on this machine is tcp.
    "same-host": ("shm", "tcp"),
}
WARMUP_BATCHES = 8


# ---------------------------------------------------------------- common


def cpu_self():
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def cpu_of(pid):
    """utime + stime of process pid (all its threads), in seconds."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / CLK


def steal_ticks():
    """(steal, all) CPU ticks of the machine, from /proc/stat."""
    with open("/proc/stat") as f:
        v = [int(x) for x in f.readline().split()[1:9]]
    return v[7], sum(v)


def die_with_parent():
    """In a child: SIGKILL when the parent goes, whatever the reason."""
    import ctypes

    ctypes.CDLL(None, use_errno=True).prctl(1, signal.SIGKILL)  # PDEATHSIG


def say(obj):
    sys.stdout.write("@@" + json.dumps(obj) + "\n")
    sys.stdout.flush()


class Child:
    """A child process spoken to in JSON lines, every answer awaited with a
    timeout (the child's other output passes through to stderr)."""

    def __init__(self, argv, env, what):
        self.what = what
        self.proc = subprocess.Popen(
            argv, env=env, stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            text=True, preexec_fn=die_with_parent, start_new_session=True)
        self.q = queue.Queue()
        threading.Thread(target=self._pump, daemon=True).start()

    def _pump(self):
        for line in self.proc.stdout:
            if line.startswith("@@"):
                self.q.put(json.loads(line[2:]))
            else:
                sys.stderr.write(line)
        self.q.put(None)

    def ask(self, obj, timeout):
        if obj is not None:
            self.proc.stdin.write(json.dumps(obj) + "\n")
            self.proc.stdin.flush()
        try:
            a = self.q.get(timeout=timeout)
        except queue.Empty:
            self.kill()
            raise RuntimeError(f"{self.what}: no answer in {timeout:.0f} s")
        if a is None:
            raise RuntimeError(f"{self.what}: ended (exit {self.proc.wait()})")
        if "error" in a:
            raise RuntimeError(f"{self.what}: {a['error']}")
        return a

    def kill(self):
        if self.proc.poll() is None:
            try:
                os.killpg(self.proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        self.proc.wait()

    def close(self, timeout=10):
        if self.proc.poll() is None:
            try:
                self.proc.stdin.write(json.dumps({"cmd": "quit"}) + "\n")
                self.proc.stdin.flush()
                self.proc.wait(timeout=timeout)
            except (OSError, subprocess.TimeoutExpired):
                pass
        self.kill()


def region():
    """SIZE bytes of anonymous memory as uint8 and uint64 views."""
    mm = mmap.mmap(-1, SIZE, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS)
    b = np.frombuffer(mm, dtype=np.uint8)
    return mm, b, b.view(np.uint64)


_BASE = np.arange(1 << 20, dtype=np.uint64)  # 8 MiB of word indices


def fill(w64, seed):
    """Every word: its index plus seed (mod 2^64); touches every page."""
    n = len(_BASE)
    for k in range(0, len(w64), n):
        np.add(_BASE, np.uint64((k + seed) % (1 << 64)), out=w64[k:k + n])


def perm(nslots, seed):
    if seed is None:
        return np.arange(nslots, dtype=np.int64)
    return np.random.default_rng(seed).permutation(nslots)


def check(w64, bs, count, dst, src, seed, sample, rng):
    """Blocks 0..count-1 of a row (slot dst[j] of w64 holds the source's
    slot src[j]): all of them, or a random sample of `sample`. Returns
    (blocks checked, blocks wrong)."""
    nslots = SIZE // bs
    n = min(count, nslots)
    js = np.arange(n) if not sample or n <= sample else \
        np.sort(rng.choice(n, sample, replace=False))
    wpb = bs // 8
    rows = w64.reshape(nslots, wpb)
    lane = np.arange(wpb, dtype=np.uint64) + np.uint64(seed)
    bad = 0
    step = max(1, (32 << 20) // bs)
    for a in range(0, len(js), step):
        j = js[a:a + step]
        exp = (src[j].astype(np.uint64) * np.uint64(wpb))[:, None] + lane
        bad += int(np.count_nonzero((rows[dst[j]] != exp).any(axis=1)))
    return len(js), bad


# ---------------------------------------------------------------- target


def target_main(protocol):
    from mooncake.engine import TransferEngine

    eng = TransferEngine()
    if eng.initialize("127.0.0.1", "P2PHANDSHAKE", protocol, "") != 0:
        say({"error": "target: initialize failed"})
        return 1
    mm, b8, w64 = region()
    fill(w64, 0)
    addr = b8.ctypes.data
    if eng.register_memory(addr, SIZE) != 0:
        say({"error": "target: register_memory failed"})
        return 1
    say({"name": f"127.0.0.1:{eng.get_rpc_port()}", "addr": addr})
    rng = np.random.default_rng()
    for line in sys.stdin:
        c = json.loads(line)
        if c["cmd"] == "quit":
            break
        if c["cmd"] == "fill":
            fill(w64, c["seed"])
            say({"ok": 1})
        elif c["cmd"] == "check":
            bs = c["bs"]
            nslots = SIZE // bs
            n, bad = check(w64, bs, c["count"], perm(nslots, c["rseed"]),
                           perm(nslots, c["lseed"]), c["seed"], c["sample"],
                           rng)
            say({"checked": n, "mismatches": bad})
    return 0


# ------------------------------------------------------------- initiator


def engine_identity(want):
    """Refuses to run on the wrong mooncake.engine; returns its version."""
    import mooncake.engine as me

    cls = me.TransferEngine
    if want == "kvt":
        import kvt

        if cls is not kvt.TransferEngine:
            raise SystemExit(f"mooncake.engine.TransferEngine is {cls!r}, "
                             "not kvt's")
        return kvt.__version__, me.__file__
    from importlib import metadata

    if not me.__file__.endswith("engine.so") or \
            type(cls).__name__ != "pybind11_type":
        raise SystemExit(f"mooncake.engine is {me.__file__}, not Mooncake's "
                         "extension")
    return metadata.version("mooncake-transfer-engine-non-cuda"), me.__file__


class Initiator:
    def __init__(self, want, protocol):
        self.version, self.module = engine_identity(want)
        from mooncake.engine import TransferEngine

        self.tgt = Child([sys.executable, HERE, "--target", protocol],
                         os.environ, "target")
        hello = self.tgt.ask(None, 120)
        self.peer, self.raddr = hello["name"], hello["addr"]
        self.eng = TransferEngine()
        if self.eng.initialize("127.0.0.1", "P2PHANDSHAKE", protocol,
                               "") != 0:
            raise RuntimeError("initiator: initialize failed")
        self.mm, self.b8, self.w64 = region()
        fill(self.w64, 0)
        self.addr = self.b8.ctypes.data
        if self.eng.register_memory(self.addr, SIZE) != 0:
            raise RuntimeError("initiator: register_memory failed")
        # What carries the bytes: kvt says; Mooncake's wheel has one
        # transport for host memory here (tcp).
        self.transport = (self.eng.get_segment_transport(self.peer)
                          if want == "kvt" else "tcp")
        self.rng = np.random.default_rng()

    def run(self, name, seconds, sample):
        op, bs, batch, depth = ROWS[name]
        nslots = SIZE // bs
        seed = int(self.rng.integers(1, 1 << 62))
        rseed = int(self.rng.integers(1 << 62))
        lseed = int(self.rng.integers(1 << 62)) if op == "request" else None
        R, L = perm(nslots, rseed), perm(nslots, lseed)
        if op == "read":
            self.tgt.ask({"cmd": "fill", "seed": seed}, 60)
        else:
            fill(self.w64, seed)
        loc = (self.addr + L * bs).tolist()
        rem = (self.raddr + R * bs).tolist()
        lens = [bs] * batch
        nb = nslots // batch
        calls = [(loc[i * batch:(i + 1) * batch],
                  rem[i * batch:(i + 1) * batch]) for i in range(nb)]
        eng, peer = self.eng, self.peer
        lat = []
        if op in ("write", "read"):
            submit = (eng.batch_transfer_async_write if op == "write"
                      else eng.batch_transfer_async_read)
            status = eng.get_batch_transfer_status

            def one(i, inflight):
                b = submit(peer, calls[i % nb][0], calls[i % nb][1], lens)
                if b == 0:
                    raise RuntimeError(f"{name}: submit failed")
                inflight.append(b)
                if len(inflight) >= depth:
                    if status([inflight.pop(0)]) != 0:
                        raise RuntimeError(f"{name}: a batch failed")

            def drain(inflight):
                while inflight:
                    if status([inflight.pop(0)]) != 0:
                        raise RuntimeError(f"{name}: a batch failed")
        else:
            if op == "sync":
                call = eng.transfer_sync_write

                def go(i):
                    return call(peer, loc[i % nslots], rem[i % nslots], bs)
            else:
                call = eng.batch_transfer_sync_write

                def go(i):
                    c = calls[i % nb]
                    return call(peer, c[0], c[1], lens)
            clock = time.perf_counter

            def one(i, inflight):
                t = clock()
                if go(i) != 0:
                    raise RuntimeError(f"{name}: a transfer failed")
                lat.append(clock() - t)

            def drain(inflight):
                pass
        inflight = []
        i = 0
        for _ in range(min(WARMUP_BATCHES, nb)):  # connections, first calls
            one(i, inflight)
            i += 1
        drain(inflight)
        lat.clear()
        first = i
        s0, a0 = steal_ticks()
        c0, t0 = cpu_self(), cpu_of(self.tgt.proc.pid)
        start = time.perf_counter()
        deadline = start + seconds
        while True:
            one(i, inflight)
            i += 1
            if (i & 7) == 0 and time.perf_counter() >= deadline:
                break
        drain(inflight)
        elapsed = time.perf_counter() - start
        cpu_i = cpu_self() - c0
        cpu_t = cpu_of(self.tgt.proc.pid) - t0
        s1, a1 = steal_ticks()
        ndesc = (i - first) * batch
        nbytes = ndesc * bs
        # Blocks moved in the row, warm-up included: slot j of the walk for
        # every j below i * batch.
        count = i * batch
        if op == "read":
            n, bad = check(self.w64, bs, count, L, R, seed, sample, self.rng)
        else:
            a = self.tgt.ask({"cmd": "check", "bs": bs, "count": count,
                              "rseed": rseed, "lseed": lseed, "seed": seed,
                              "sample": sample}, 300)
            n, bad = a["checked"], a["mismatches"]
        gb = nbytes / 1e9
        out = {"row": name, "op": op, "block": bs, "batch": batch,
               "depth": depth, "seconds": elapsed, "bytes": nbytes,
               "gbps": gb / elapsed, "cpu_init_per_gb": cpu_i / gb,
               "cpu_target_per_gb": cpu_t / gb,
               "cpu_per_gb": (cpu_i + cpu_t) / gb,
               "steal_pct": 100.0 * (s1 - s0) / max(1, a1 - a0),
               "checked": n, "mismatches": bad,
               "verified": n > 0 and bad == 0}
        if lat:
            lat.sort()
            out["p50_us"] = lat[len(lat) // 2] * 1e6
            out["p99_us"] = lat[min(len(lat) - 1, len(lat) * 99 // 100)] * 1e6
            out["calls"] = len(lat)
            out["ms_per_call"] = statistics.median(lat) * 1e3
        return out


def initiator_main(want, protocol):
    try:
        ini = Initiator(want, protocol)
    except Exception as e:  # reported to the driver, which stops
        say({"error": f"{type(e).__name__}: {e}"})
        return 1
    say({"version": ini.version, "module": ini.module,
         "transport": ini.transport, "python": sys.executable})
    try:
        for line in sys.stdin:
            c = json.loads(line)
            if c["cmd"] == "quit":
                break
            try:
                say(ini.run(c["row"], c["seconds"], c["sample"]))
            except Exception as e:
                say({"error": f"{c['row']}: {type(e).__name__}: {e}"})
                return 1
    finally:
        ini.tgt.close()
    return 0


# ---------------------------------------------------------------- driver

UNITS = {"gbps": "GB/s", "cpu_per_gb": "CPU s/GB", "p50_us": "us",
         "p99_us": "us", "ms_per_call": "ms"}
LABELS = {"gbps": "", "cpu_per_gb": "CPU", "p50_us": "p50", "p99_us": "p99",
          "ms_per_call": "per call"}
LOWER_BETTER = {"cpu_per_gb", "p50_us", "p99_us", "ms_per_call"}


def metrics_of(op):
    if op == "sync":
        return ["p50_us", "p99_us", "cpu_per_gb"]
    if op == "request":
        return ["ms_per_call", "gbps", "cpu_per_gb"]
    return ["gbps", "cpu_per_gb"]


def driver(a):
    rows = QUICK_ROWS if a.quick else (a.rows or list(ROWS))
    configs = ["tcp"] if a.quick else a.configs
    # Mooncake: its INFO log (a line for every completed batch) off; as
    # many tcp connections to the peer as kvt has; a per-peer queue that
    # admits the request row's 4096 descriptors in one call (the default,
    # 1024, refuses it with "TCP lane queue-full rejection").
    base = dict(os.environ, KVT_LOG="error", MC_LOG_LEVEL="ERROR",
                MC_TCP_LANES_PER_PEER=str(a.lanes),
                MC_TCP_MAX_QUEUED_TRANSFERS_PER_PEER="4096")
    base.pop("PYTHONPATH", None)
    envs = {"kvt": dict(base, PYTHONPATH=a.kvt_python), "Mooncake": base}
    kids = []

    def cleanup():
        # A second Ctrl-C (timeout forwards one too) must not cut this
        # short; the children also die with this process (PDEATHSIG).
        for sig in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
            signal.signal(sig, signal.SIG_IGN)
        for k in kids:
            k.kill()

    def stop(*_):
        cleanup()
        raise SystemExit(130)

    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    results = []  # (config, engine, round, result)
    info = {}
    limit = a.seconds * 4 + 180
    try:
        for cfg in configs:
            kprot, mprot = CONFIGS[cfg]
            ini = {}
            for eng, prot in (("kvt", kprot), ("Mooncake", mprot)):
                want = "kvt" if eng == "kvt" else "mooncake"
                k = Child([sys.executable, HERE, "--initiator", want, prot],
                          envs[eng], f"{eng} {cfg} initiator")
                kids.append(k)
                hello = k.ask(None, 180)
                info[(cfg, eng)] = dict(hello, protocol=prot)
                ini[eng] = k
                print(f"# {cfg}: {eng} {hello['version']} "
                      f"({hello['module']}), protocol {prot!r}, "
                      f"transport {hello['transport']}", flush=True)
            if cfg == "same-host" and info[(cfg, "kvt")]["transport"] != "shm":
                raise RuntimeError("kvt did not choose shm for a same-host "
                                   "peer: " + info[(cfg, "kvt")]["transport"])
            for r in range(a.rounds):
                order = ["kvt", "Mooncake"] if r % 2 == 0 else \
                    ["Mooncake", "kvt"]
                for row in rows:
                    for eng in order:
                        res = ini[eng].ask({"cmd": "run", "row": row,
                                            "seconds": a.seconds,
                                            "sample": a.verify}, limit)
                        results.append((cfg, eng, r, res))
                        if a.verbose:
                            print(f"# {cfg} {eng} round {r}: "
                                  f"{json.dumps(res)}", flush=True)
            for k in ini.values():
                k.close()
    except (KeyboardInterrupt, RuntimeError) as e:
        cleanup()
        print(f"anchors: {str(e) or 'interrupted'}", file=sys.stderr)
        return 130 if isinstance(e, KeyboardInterrupt) else 1
    bad = report(a, configs, rows, results, info)
    if bad:
        print(f"anchors: bytes did not check out in {', '.join(bad)}",
              file=sys.stderr)
    return 1 if bad else 0


def report(a, configs, rows, results, info):
    print(f"\n{a.rounds} rounds of {a.seconds:g} s a row, medians; "
          f"Mooncake: MC_TCP_LANES_PER_PEER={a.lanes}; "
          "CPU s/GB: initiator + target")
    print(f"{'row':<36} {'unit':<9} {'kvt':>12} {'Mooncake':>12} "
          f"{'kvt/MC':>7}  verified")
    lines = []
    for cfg in configs:
        print(f"-- {cfg}: kvt over {info[(cfg, 'kvt')]['transport']}, "
              f"Mooncake over {info[(cfg, 'Mooncake')]['transport']}")
        for row in rows:
            got = {e: [res for c, en, _, res in results
                       if c == cfg and en == e and res["row"] == row]
                   for e in ("kvt", "Mooncake")}
            if not got["kvt"] or not got["Mooncake"]:
                continue
            ver = all(r["verified"] for e in got for r in got[e])
            checked = {e: sum(r["checked"] for r in got[e]) for e in got}
            for m in metrics_of(ROWS[row][0]):
                med = {e: statistics.median(r[m] for r in got[e])
                       for e in got}
                ratio = med["kvt"] / med["Mooncake"] if med["Mooncake"] \
                    else float("nan")
                if m == "cpu_per_gb":
                    part = {e: (statistics.median(r["cpu_init_per_gb"]
                                                  for r in got[e]),
                                statistics.median(r["cpu_target_per_gb"]
                                                  for r in got[e]))
                            for e in got}
                    cell = {e: f"{part[e][0]:.2f}+{part[e][1]:.2f}"
                            for e in got}
                else:
                    cell = {e: f"{med[e]:.3g}" if med[e] < 100 else
                            f"{med[e]:.0f}" for e in got}
                label = f"{cfg} {row} {LABELS[m]}".rstrip()
                print(f"{label:<36} {UNITS[m]:<9} {cell['kvt']:>12} "
                      f"{cell['Mooncake']:>12} {ratio:7.2f}  "
                      f"{'yes' if ver else 'NO'}")
                lines.append({
                    "name": f"{cfg}-{row}-{m}", "config": cfg, "row": row,
                    "metric": m, "unit": UNITS[m], "kvt": med["kvt"],
                    "mooncake": med["Mooncake"], "ratio": ratio,
                    "better": "lower" if m in LOWER_BETTER else "higher",
                    "verified": ver, "blocks_checked": checked,
                    **({"kvt_init_target": part["kvt"],
                        "mooncake_init_target": part["Mooncake"]}
                       if m == "cpu_per_gb" else {}),
                    "kvt_steal_pct": statistics.median(
                        r["steal_pct"] for r in got["kvt"]),
                    "rounds": a.rounds, "seconds": a.seconds,
                    "kvt_transport": info[(cfg, "kvt")]["transport"],
                    "kvt_version": info[(cfg, "kvt")]["version"],
                    "mooncake_version": info[(cfg, "Mooncake")]["version"]})
    print()
    for ln in lines:
        print("@json " + json.dumps(ln))
    if a.json:
        with open(a.json, "w") as f:
            for ln in lines:
                f.write(json.dumps(ln) + "\n")
    return sorted({f"{ln['config']} {ln['row']}" for ln in lines
                   if not ln["verified"]})


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--target":
        return target_main(sys.argv[2])
    if len(sys.argv) > 1 and sys.argv[1] == "--initiator":
        return initiator_main(sys.argv[2], sys.argv[3])
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--seconds", type=float, default=2.0)
    p.add_argument("--configs", default="tcp,same-host",
                   type=lambda s: s.split(","))
    p.add_argument("--rows", type=lambda s: s.split(","), default=None)
    p.add_argument("--quick", action="store_true",
                   help="tcp only, the rows bench/ratio-check checks")
    p.add_argument("--verify", type=int, default=0,
                   help="blocks checked a row: 0 all moved (default), N a "
                        "random sample of N")
    p.add_argument("--lanes", type=int, default=2,
                   help="MC_TCP_LANES_PER_PEER (kvt has 2 connections a "
                        "peer)")
    p.add_argument("--kvt-python", default="build/python")
    p.add_argument("--json", help="also write the JSON lines to this file")
    p.add_argument("-v", "--verbose", action="store_true")
    a = p.parse_args()
    for c in a.configs:
        if c not in CONFIGS:
            p.error(f"unknown configuration {c}")
    for r in a.rows or []:
        if r not in ROWS:
            p.error(f"unknown row {r}")
    a.kvt_python = os.path.abspath(a.kvt_python)
    return driver(a)


if __name__ == "__main__":
    sys.exit(main())
