#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# Same-host transport: kvt bench writes over shm beside matched ceilings,
# measured in alternating rounds of the same run, medians and ratios.
# Each ceiling (`kvt_baseline copy-matched`) moves the same blocks along
# the same walk through the same cold working set with as many threads as
# kvt copies with and the same store kind, into the very pages kvt writes
# into (the target's buffer: which pages a process got moves the figure by
# up to a sixth on this VM, the same way for every run into it;
# docs/benchmarks.md, "One target for both"):
#   - into kvt_mem_alloc() memory, which kvt maps and copies into with
#     streaming stores: memcpy with streaming stores, through a mapping of
#     the same memory object;
#   - into plain registered memory, which kvt reaches by cross-memory
#     attach: process_vm_writev() into the target, a call per batch.
# 16 MiB blocks (batch 4: a 64 MiB submission), 1 MiB (batch 32: 32 MiB)
# and 64 KiB (batch 32: 2 MiB) are cut into jobs (2 MiB and more are)
# copied by the submitting thread and the engine's 2 workers, as many at
# once as the machine has CPUs, at most 3: the ceiling copies with as many
# threads. Scattered 4 KiB (batch 128: 512 KiB) is one job, one thread.
# For 1 MiB and 16 MiB kvt keeps 2 batches in flight, as bench/tcp.sh
# does: the ceiling's threads copy without a pause, where with one batch
# at a time kvt's copiers would wait at the end of each batch for the next
# one, and every CPU copies either way. The smaller blocks keep one batch
# in flight (a synchronous transfer).
#
# Runs are bracketed: ceiling, kvt, ceiling, kvt, ..., ceiling (ROUNDS kvt
# runs, ROUNDS+1 ceiling runs). Each kvt run is divided by the mean of the
# two ceiling runs either side of it and the ratio printed is the median
# of those; the GB/s columns are medians of each program's runs. The
# memory bandwidth of a shared host moves between levels for seconds at a
# time (this VM: 30 to 35 and 50 to 59 GB/s for the same copy), and a
# ratio of medians over alternating runs then compares runs made in
# different levels (docs/benchmarks.md, "Bracketed rounds").
#   bench/shm.sh [ROUNDS] [SECONDS]      (run from the project root after make)
set -euo pipefail
ROUNDS=${1:-3}
SECS=${2:-3}
WSET=512M
KVT=build/bin/kvt
BASE=build/bin/kvt_baseline
[ -x "$KVT" ] && [ -x "$BASE" ] || { echo "run make first"; exit 1; }
TMP=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$TMP"' EXIT

# start_target NAME ARGS...: a kvt bench target; sets SEG to its segment
# and AT to its process and buffer address.
start_target() {
    local log="$TMP/target-$1"; shift
    "$KVT" bench --mode=target --local=127.0.0.1 --protocol=shm --buffer-size=1G "$@" >"$log" 2>&1 &
    PIDS+=($!)
    SEG=
    for _ in $(seq 300); do
        SEG=$(sed -n 's/^segment: *//p' "$log")
        AT="$! $(sed -n 's/^buffer: *\(0x[0-9a-f]*\) .*/\1/p' "$log")"
        [ -n "$SEG" ] && [ "${AT#* }" != "" ] && return 0
        sleep 0.1
    done
    echo "target did not start"; cat "$log"; exit 1
}
start_target managed --buffer=managed; MANAGED=$SEG; MANAGED_AT=$AT
start_target malloc --buffer=malloc; MALLOC=$SEG; MALLOC_AT=$AT
NCPU=$(nproc); BIG_THREADS=$(( NCPU < 3 ? NCPU : 3 ))

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"

# base: one run of the ceiling for the current spec, appended to $TMP/s.
# shellcheck disable=SC2086
base() { "$BASE" copy-matched "$SECS" "$threads" "$blk" "$WSET" "$pat" $how "$batch" $at >>"$TMP/s"; }

printf '%-40s %8s %-30s %8s %6s\n' "kvt (carried by), batches in flight" "GB/s" "matched ceiling" "GB/s" ratio
for spec in managed:16M:4:contig malloc:16M:4:contig managed:1M:32:contig \
    malloc:1M:32:contig managed:64K:32:contig malloc:64K:32:contig \
    managed:4K:128:scatter malloc:4K:128:scatter; do
    IFS=: read -r buf blk batch pat <<<"$spec"
    seg=$MANAGED; at=$MANAGED_AT; kind="memcpy nt"; how="nt memcpy"
    [ "$buf" = malloc ] && { seg=$MALLOC; at=$MALLOC_AT; kind="process_vm_writev"; how="plain cma"; }
    threads=1; depth=1
    [ "$blk" = 4K ] || threads=$BIG_THREADS
    case $blk in 1M | 16M) depth=2 ;; esac
    : >"$TMP/k"; : >"$TMP/s"; : >"$TMP/p"
    base
    for _ in $(seq "$ROUNDS"); do
        "$KVT" bench --mode=initiator --segment="$seg" --protocol=shm --op=write \
            --block-size="$blk" --batch-size="$batch" --pattern="$pat" \
            --working-set="$WSET" --threads=1 --depth="$depth" --duration="$SECS" --json \
            2>>"$TMP/log" | tail -1 >"$TMP/json"
        python3 -c "import json; d=json.load(open('$TMP/json')); print(d['gbps'])" >>"$TMP/k"
        python3 -c "import json; d=json.load(open('$TMP/json')); print(d['protocol'])" >>"$TMP/p"
        base
    done
    k=$(median <"$TMP/k"); s=$(median <"$TMP/s")
    printf '%-40s %8s %-30s %8s %6.2f\n' "$blk x$batch $pat, $buf ($(sort -u "$TMP/p" | paste -sd/ -)), $depth" \
        "$k" "$kind, $threads thread(s)" "$s" "$(bracketed "$TMP/k" "$TMP/s")"
done
