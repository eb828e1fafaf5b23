#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# TCP loopback: kvt bench writes beside a matched ceiling, measured in
# turn in the same run, medians and ratios:
#   - bandwidth for 4 KiB blocks (scattered, as paged KV blocks are),
#     64 KiB, 1 MiB and 16 MiB: kvt with CONNS connections per peer (its
#     default, 2) against `kvt_baseline tcp-matched` with as many TCP
#     streams, the same block walk, the same cold working set on both
#     sides, and a receiver that reads each whole message into the
#     scattered destination; kvt keeps DEPTH batches in flight (default
#     2, so that the connection does not idle while the thread builds the
#     next batch, as the ceiling's streams never do);
#   - 1 MiB once more with a warm working set: 32 MiB of source and 32
#     MiB of target span (kvt bench's old default source, which stays in
#     the cache in part), kvt and the ceiling cycling the same sets;
#   - a synchronous 4 KiB write (batch of one) against a 4 KiB TCP
#     ping-pong, with both processes pinned to one CPU and to two
#     (placement changes a loopback round trip several-fold); beside it,
#     for reference, the floor of kvt's own system calls: the same round
#     trip with a 32-byte answer from a responder that waits in
#     epoll_wait(), both processes multi-threaded (kvt_baseline
#     tcp-floor), which no code of kvt's own is in.
# Both kvt engines are limited to tcp (on one host they would pick shm).
# Bandwidth runs are bracketed: ceiling, kvt, ceiling, ..., ceiling; each
# kvt run is divided by the mean of the ceiling runs either side of it,
# and the ratio printed is the median of those (the GB/s columns are
# medians of each program's runs), so that a machine whose speed drifts
# during the run compares runs made close together (docs/benchmarks.md,
# "Bracketed rounds").
#   bench/tcp.sh [ROUNDS] [SECONDS]      (run from the project root after make)
#   CONNS=1 bench/tcp.sh                 (connections per peer, both sides)
#   DEPTH=1 bench/tcp.sh                 (batches in flight per thread)
set -euo pipefail
ROUNDS=${1:-3}
SECS=${2:-3}
CONNS=${CONNS:-2}
DEPTH=${DEPTH:-2}
WSET=512M
KVT=build/bin/kvt
BASE=build/bin/kvt_baseline
[ -x "$KVT" ] && [ -x "$BASE" ] || { echo "run make first"; exit 1; }
TMP=$(mktemp -d)
trap 'j=$(jobs -p); [ -z "$j" ] || kill $j 2>/dev/null || true; wait 2>/dev/null; rm -rf "$TMP"' EXIT

# target NAME [taskset prefix...]: a kvt bench target; its segment in $TMP/seg.NAME
target() {
    local name=$1; shift
    "$@" "$KVT" bench --mode=target --local=127.0.0.1 --protocol=tcp --buffer-size=1G \
        --conns="$CONNS" >"$TMP/target.$name" 2>&1 &
    for _ in $(seq 100); do grep -qs '^segment:' "$TMP/target.$name" && break; sleep 0.1; done
    sed -n 's/^segment: *//p' "$TMP/target.$name" >"$TMP/seg.$name"
    [ -s "$TMP/seg.$name" ] || { echo "target did not start"; cat "$TMP/target.$name"; exit 1; }
}
field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read().splitlines()[-1])['$1'])"; }
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
size() { python3 -c "import sys; s=sys.argv[1]; m={'K':1<<10,'M':1<<20,'G':1<<30}; print(int(s[:-1])*m[s[-1]] if s[-1] in m else int(s))" "$1"; }

target bw
SEG=$(cat "$TMP/seg.bw")
echo "kvt: $CONNS connection(s) per peer, $DEPTH batch(es) in flight; ceiling: $CONNS stream(s)"
printf '%-6s %-8s %5s %5s %10s %12s %7s %10s\n' block pattern batch wset "kvt GB/s" "matched GB/s" ratio "kvt s/GB"
for spec in 4K:128:scatter 64K:128:contig 1M:32:contig 1M:32:contig:32M 16M:4:contig; do
    IFS=: read -r blk batch pat ws <<<"$spec"
    ws=${ws:-$WSET}
    msg=$(( $(size "$blk") * batch ))
    : >"$TMP/k"; : >"$TMP/s"; : >"$TMP/c"
    "$BASE" tcp-matched "$SECS" "$CONNS" "$blk" "$ws" "$pat" "$msg" >>"$TMP/s"
    for _ in $(seq "$ROUNDS"); do
        "$KVT" bench --mode=initiator --segment="$SEG" --protocol=tcp --op=write \
            --block-size="$blk" --batch-size="$batch" --pattern="$pat" \
            --working-set="$ws" --conns="$CONNS" --threads=1 --depth="$DEPTH" \
            --duration="$SECS" \
            --json | tail -1 >"$TMP/json"
        field gbps <"$TMP/json" >>"$TMP/k"
        python3 -c "import json; d=json.load(open('$TMP/json')); print(d['cpu_s_per_gb'] + (d['target_cpu_s_per_gb'] or 0))" >>"$TMP/c"
        "$BASE" tcp-matched "$SECS" "$CONNS" "$blk" "$ws" "$pat" "$msg" >>"$TMP/s"
    done
    k=$(median <"$TMP/k"); s=$(median <"$TMP/s"); c=$(median <"$TMP/c")
    printf '%-6s %-8s %5s %5s %10s %12s %7.2f %10.2f\n' "$blk" "$pat" "$batch" "$ws" "$k" "$s" \
        "$(bracketed "$TMP/k" "$TMP/s")" "$c"
done

# Latency: one target per placement, pinned with the initiator.
read -r C0 C1 < <(python3 -c "import os; c=sorted(os.sched_getaffinity(0)); print(c[0], c[1] if len(c) > 1 else c[0])")
target same taskset -c "$C0"
target split taskset -c "$C1"
printf '\n%-28s %10s %14s %7s %10s\n' "sync 4 KiB write, p50" "kvt us" "ping-pong us" ratio "floor us"
for place in same split; do
    : >"$TMP/k"; : >"$TMP/s"; : >"$TMP/f"
    for _ in $(seq "$ROUNDS"); do
        taskset -c "$C0" "$KVT" bench --mode=initiator --segment="$(cat "$TMP/seg.$place")" \
            --protocol=tcp --op=write --block-size=4K --batch-size=1 --pattern=contig \
            --working-set=4K --conns="$CONNS" --threads=1 --duration=2 --json | field lat_p50_us >>"$TMP/k"
        "$BASE" tcp-pingpong 20000 4K "$place" >>"$TMP/s"
        "$BASE" tcp-floor 20000 4K "$place" >>"$TMP/f"
    done
    k=$(median <"$TMP/k"); s=$(median <"$TMP/s"); f=$(median <"$TMP/f")
    label="one CPU for both"; [ "$place" = split ] && label="a CPU each"
    printf '%-28s %10s %14s %7.2f %10s\n' "$label" "$k" "$s" "$(python3 -c "print($k/$s)")" "$f"
done
