#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Same-host transport: kvt bench writes over shm beside the machine's own
# ceilings, measured in alternating rounds in the same run:
#   1 MiB blocks (batch 32) into kvt_mem_alloc() memory (mapped by the
#     initiator)            vs a plain single-thread memcpy of 1 MiB blocks;
#   1 MiB blocks (batch 32) into plain registered memory (cross-memory
#     attach)               vs a plain process_vm_writev loop of 1 MiB blocks;
#   4 KiB blocks (batch 128) over shm vs over tcp, into the same target.
# Prints medians and ratios, and which transport carried each kvt figure.
#   bench/shm.sh [ROUNDS] [SECONDS]      (run from the project root after make)
set -euo pipefail
ROUNDS=${1:-3}
SECS=${2:-3}
KVT=build/bin/kvt
BASE=build/bin/kvt_baseline
[ -x "$KVT" ] && [ -x "$BASE" ] || { echo "run make first"; exit 1; }
TMP=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null; done; wait 2>/dev/null; rm -rf "$TMP"' EXIT

# start_target NAME ARGS...: a kvt bench target; sets SEG to its segment.
start_target() {
    local log="$TMP/target-$1"; shift
    "$KVT" bench --mode=target --local=127.0.0.1 --protocol=shm --buffer-size=1G "$@" >"$log" 2>&1 &
    PIDS+=($!)
    SEG=
    for _ in $(seq 300); do
        SEG=$(sed -n 's/^segment: *//p' "$log")
        [ -n "$SEG" ] && return 0
        sleep 0.1
    done
    echo "target did not start"; cat "$log"; exit 1
}
start_target managed --buffer=managed; MANAGED=$SEG
start_target malloc --buffer=malloc; MALLOC=$SEG

# kvt SEGMENT PROTOCOL BLOCK BATCH: one run; appends gbps to $TMP/<tag>
# and the carrying transport to $TMP/<tag>.proto.
kvt() {
    local tag=$1; shift
    "$KVT" bench --mode=initiator --segment="$1" --protocol="$2" --op=write \
        --block-size="$3" --batch-size="$4" --threads=1 --duration="$SECS" \
        --json 2>>"$TMP/log" | tail -1 >"$TMP/json"
    python3 -c "import json; d=json.load(open('$TMP/json')); print(d['gbps'])" >>"$TMP/$tag"
    python3 -c "import json; d=json.load(open('$TMP/json')); print(d['protocol'])" >>"$TMP/$tag.proto"
}
median() { sort -g | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
ratio() { python3 -c "print('%.2f' % ($1/$2))"; }
carried() { sort -u "$TMP/$1.proto" | paste -sd/ -; }

for _ in $(seq "$ROUNDS"); do
    kvt managed "$MANAGED" shm 1M 32
    "$BASE" memcpy 3072 1M >>"$TMP/memcpy"
    kvt malloc "$MALLOC" shm 1M 32
    "$BASE" cma 3072 1M >>"$TMP/cma"
    kvt shm4k "$MALLOC" shm 4K 128
    kvt tcp4k "$MALLOC" tcp 4K 128
done

m=$(median <"$TMP/managed"); mc=$(median <"$TMP/memcpy")
c=$(median <"$TMP/malloc"); cc=$(median <"$TMP/cma")
s=$(median <"$TMP/shm4k"); t=$(median <"$TMP/tcp4k")
printf '%-34s %10s %-26s %10s %7s\n' "kvt (carried by)" "GB/s" "ceiling" "GB/s" ratio
printf '%-34s %10s %-26s %10s %7s\n' "1 MiB x32 into kvt_mem_alloc ($(carried managed))" "$m" \
    "memcpy, 1 thread" "$mc" "$(ratio "$m" "$mc")"
printf '%-34s %10s %-26s %10s %7s\n' "1 MiB x32 into malloc ($(carried malloc))" "$c" \
    "process_vm_writev loop" "$cc" "$(ratio "$c" "$cc")"
printf '%-34s %10s %-26s %10s %7s\n' "4 KiB x128 ($(carried shm4k))" "$s" \
    "kvt over $(carried tcp4k)" "$t" "$(ratio "$s" "$t")"
if [ "$(carried managed)$(carried malloc)$(carried shm4k)" != shmshmshm ]; then
    echo "note: shm did not carry every kvt shm figure; the engine log says why:"
    grep -m3 'shm' "$TMP/log" || true
fi
