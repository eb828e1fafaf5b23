# SPDX-License-Identifier: Apache-2.0
"""What `kvt metad` really holds for its keys, against what it charges.

Starts `kvt metad` on a free loopback port, reads its resident set size
(VmRSS), PUTs N keys shaped like Mooncake's (40 bytes) with values of the
given sizes over one keep-alive connection, reads VmRSS again and
`kvt_metad_store_bytes` from /metrics, and prints the growth of the one
over the other; the bar is 1.2. A fresh server for each value size.
Then, with `--max-bytes 32M`, 16 clients each announce a 16 MiB body
and send all of it but the last KiB; the script prints how much VmRSS
grew while they wait (the bar: about 32 MiB, the limit, plus buffers).
Figures, not pass/fail: the exit status is 0 whenever the measurements
ran.

Usage (from the repository root, after `make`):
    python3 bench/metad_memory.py [--keys=20000] [--sizes=1,110,1000,4096]
"""

import argparse
import http.client
import re
import socket
import subprocess
import time


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def vm_rss(pid):
    with open(f"/proc/{pid}/status") as f:
        return int(re.search(r"VmRSS:\s+(\d+)", f.read()).group(1)) * 1024


def measure(kvt, keys, size):
    port = free_port()
    proc = subprocess.Popen([kvt, "metad", "--port", str(port)],
                            stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()  # "metad: listening on ..."
        conn = http.client.HTTPConnection("127.0.0.1", port, timeout=10)
        conn.request("PUT", "/metadata?key=warm", body=b"x")
        conn.getresponse().read()
        time.sleep(0.2)
        before = vm_rss(proc.pid)
        value = b"v" * size
        for i in range(keys):
            conn.request("PUT", "/metadata?key=mooncake/ram/10.0.0.1:%05d"
                         "/segment-xx" % i, body=value)
            conn.getresponse().read()
        time.sleep(0.2)
        grown = vm_rss(proc.pid) - before
        conn.request("GET", "/metrics")
        text = conn.getresponse().read().decode()
        charged = int(re.search(r"\nkvt_metad_store_bytes (\d+)",
                                text).group(1))
        return grown, charged
    finally:
        proc.terminate()
        proc.wait()


def measure_uploads(kvt, uploads=16, size=16 << 20):
    port = free_port()
    proc = subprocess.Popen([kvt, "metad", "--port", str(port),
                             "--max-bytes", "32M"], stdout=subprocess.PIPE)
    socks = []
    try:
        proc.stdout.readline()
        time.sleep(0.2)
        before = vm_rss(proc.pid)
        body = b"u" * (size - 1024)
        for i in range(uploads):
            s = socket.create_connection(("127.0.0.1", port))
            s.sendall(b"PUT /metadata?key=up%d HTTP/1.1\r\nHost: x\r\n"
                      b"Content-Length: %d\r\n\r\n" % (i, size))
            s.settimeout(5)
            try:
                s.sendall(body)  # refused uploads are closed early
            except OSError:
                pass
            socks.append(s)
        time.sleep(1)
        return vm_rss(proc.pid) - before
    finally:
        for s in socks:
            s.close()
        proc.terminate()
        proc.wait()


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--kvt", default="build/bin/kvt")
    ap.add_argument("--keys", type=int, default=20000)
    ap.add_argument("--sizes", default="1,110,1000,4096")
    args = ap.parse_args()
    for size in (int(s) for s in args.sizes.split(",")):
        grown, charged = measure(args.kvt, args.keys, size)
        print(f"{args.keys} x {size}-byte values: VmRSS grew {grown} bytes, "
              f"charged {charged}, ratio {grown / charged:.3f} (bar 1.2)")
    grown = measure_uploads(args.kvt)
    print(f"16 unfinished 16 MiB uploads, --max-bytes 32M: VmRSS grew "
          f"{grown / (1 << 20):.1f} MiB")


if __name__ == "__main__":
    main()
