#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# TCP loopback: kvt bench writes beside a plain socket stream between two
# processes (the machine's ceiling), measured in alternating rounds in the
# same run, for 4 KiB, 64 KiB, 1 MiB and 16 MiB blocks; then a synchronous
# 4 KiB write beside a 64-byte ping-pong. Prints medians and ratios. Both
# kvt engines are limited to tcp: on one host they would otherwise pick
# shm, and the figures would not be tcp's.
#   bench/tcp.sh [ROUNDS] [SECONDS]      (run from the project root after make)
set -euo pipefail
ROUNDS=${1:-3}
SECS=${2:-3}
KVT=build/bin/kvt
BASE=build/bin/kvt_baseline
[ -x "$KVT" ] && [ -x "$BASE" ] || { echo "run make first"; exit 1; }
TMP=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; rm -rf "$TMP"' EXIT

"$KVT" bench --mode=target --local=127.0.0.1 --protocol=tcp --buffer-size=1G >"$TMP/target" 2>&1 &
for _ in $(seq 100); do grep -q '^segment:' "$TMP/target" && break; sleep 0.1; done
SEG=$(sed -n 's/^segment: *//p' "$TMP/target")
[ -n "$SEG" ] || { echo "target did not start"; cat "$TMP/target"; exit 1; }

field() { python3 -c "import json,sys; print(json.loads(sys.stdin.read().splitlines()[-1])['$1'])"; }
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }

printf '%-8s %6s %12s %12s %7s\n' block batch "kvt GB/s" "socket GB/s" ratio
for spec in 4K:128 64K:128 1M:32 16M:4; do
    blk=${spec%:*}; batch=${spec#*:}
    : >"$TMP/k"; : >"$TMP/s"
    for _ in $(seq "$ROUNDS"); do
        "$KVT" bench --mode=initiator --segment="$SEG" --protocol=tcp --op=write --block-size="$blk" \
            --batch-size="$batch" --threads=1 --duration="$SECS" --json | field gbps >>"$TMP/k"
        "$BASE" tcp-stream "$SECS" "$blk" >>"$TMP/s"
    done
    k=$(median <"$TMP/k"); s=$(median <"$TMP/s")
    printf '%-8s %6s %12s %12s %7.2f\n' "$blk" "$batch" "$k" "$s" "$(python3 -c "print($k/$s)")"
done

: >"$TMP/k"; : >"$TMP/s"
for _ in $(seq "$ROUNDS"); do
    "$KVT" bench --mode=initiator --segment="$SEG" --protocol=tcp --op=write --block-size=4K \
        --batch-size=1 --threads=1 --duration=2 --json | field lat_p50_us >>"$TMP/k"
    "$BASE" tcp-pingpong 20000 >>"$TMP/s"
done
k=$(median <"$TMP/k"); s=$(median <"$TMP/s")
printf '\nsync 4 KiB write p50 %s us, 64 B TCP ping-pong %s us: ratio %.2f\n' \
    "$k" "$s" "$(python3 -c "print($k/$s)")"
