#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# kvt bench --verify end to end: writes checked at the target and reads
# checked here, scattered and contiguous, over tcp and shm, find no
# mismatch; and a second writer scribbling over the same blocks is caught
# (mismatches counted, exit status 1).
#   bench_verify.sh KVT
set -eu
KVT=$1
TMP=$(mktemp -d)
PIDS=
# Every process started here is in PIDS (`kill $(jobs -p)` kills nothing
# under dash, and a target started inside $(...) is no job of this shell).
trap 'kill $PIDS 2>/dev/null || true; wait 2>/dev/null || true; rm -rf "$TMP"' EXIT

target() { # proto: starts a target, its segment in $TMP/seg.proto
    "$KVT" bench --mode=target --local=127.0.0.1 --protocol="$1" \
        --buffer-size=64M >"$TMP/target.$1" 2>&1 &
    PIDS="$PIDS $!"
    for _ in $(seq 100); do grep -qs '^segment:' "$TMP/target.$1" && break; sleep 0.1; done
    sed -n 's/^segment: *//p' "$TMP/target.$1" >"$TMP/seg.$1"
}
field() { python3 -c "import json,sys; print(json.loads(open(sys.argv[1]).read().splitlines()[-1])[sys.argv[2]])" "$@"; }

for proto in tcp shm; do
    target $proto
    SEG=$(cat "$TMP/seg.$proto")
    [ -n "$SEG" ] || { cat "$TMP/target.$proto"; exit 1; }
    for op in write read; do
        for spec in 4K:scatter:1 256K:contig:1 4K:scatter:3; do
            bs=${spec%%:*}; rest=${spec#*:}; pat=${rest%%:*}; depth=${rest#*:}
            "$KVT" bench --mode=initiator --segment="$SEG" --protocol=$proto \
                --op=$op --block-size=$bs --batch-size=16 --threads=2 \
                --depth="$depth" --duration=0.5 --verify --json \
                >"$TMP/out" 2>"$TMP/err" ||
                { cat "$TMP/out" "$TMP/err"; exit 1; }
            [ "$(field "$TMP/out" protocol)" = $proto ]
            [ "$(field "$TMP/out" pattern)" = $pat ]
            [ "$(field "$TMP/out" mismatches)" = 0 ]
            [ "$(field "$TMP/out" errors)" = 0 ]
            [ "$(field "$TMP/out" verified_blocks)" -gt 0 ]
            [ "$(field "$TMP/out" depth)" = "$depth" ]
            echo "$proto $op $bs $pat depth $depth: $(field "$TMP/out" verified_blocks) blocks verified"
        done
    done
done

# A writer without --verify scribbles over blocks of a verified run while
# and after it: the target must find blocks that differ, and the run must
# fail. The scribbler cycles through the first 1 MiB of thread 0's part;
# the verified run through the first 32 MiB, which holds it, so a block
# the verified run wrote early in its last pass stays open to the
# scribbler for the rest of that pass (tens of ms) and the check. With
# both in the same 1 MiB, a pass took about a millisecond, and a
# scribbler off the CPU for that long (a loaded machine) wrote nothing
# in it: the run passed.
SEG=$(sed -n 's/^segment: *//p' "$TMP/target.tcp")
"$KVT" bench --mode=initiator --segment="$SEG" --protocol=tcp --op=write \
    --block-size=4K --batch-size=16 --depth=2 --working-set=1M --duration=4 \
    >"$TMP/scribbler" 2>&1 &
PIDS="$PIDS $!"
sleep 0.5
if "$KVT" bench --mode=initiator --segment="$SEG" --protocol=tcp --op=write \
    --block-size=4K --batch-size=16 --working-set=32M --duration=1 --verify \
    --json >"$TMP/out" 2>"$TMP/err"; then
    cat "$TMP/out" "$TMP/scribbler"; echo "a scribbled run passed --verify"; exit 1
fi
bad=$(field "$TMP/out" mismatches)
[ "$bad" -gt 0 ] || { cat "$TMP/out" "$TMP/scribbler"; exit 1; }
echo "scribbled: $bad of $(field "$TMP/out" verified_blocks) blocks differ, as they should"

# A target that is not kvt bench (an engine of the Python binding) does
# not answer: the figures come without its CPU time, and --verify is
# refused before the run instead of reporting nothing checked.
if [ -n "${PYTHONPATH:-}" ] && python3 -c 'import kvt' 2>/dev/null; then
    python3 -c '
import ctypes, kvt, mmap, sys, time
e = kvt.TransferEngine()
assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
b = mmap.mmap(-1, 64 << 20)
assert e.register_memory(ctypes.addressof(ctypes.c_char.from_buffer(b)), len(b)) == 0
print("segment: 127.0.0.1:%d" % e.get_rpc_port(), flush=True)
time.sleep(120)' >"$TMP/target.py" 2>&1 &
    PYPID=$!
    PIDS="$PIDS $!"
    for _ in $(seq 100); do grep -qs '^segment:' "$TMP/target.py" && break; sleep 0.1; done
    PSEG=$(sed -n 's/^segment: *//p' "$TMP/target.py")
    [ -n "$PSEG" ] || { cat "$TMP/target.py"; exit 1; }
    "$KVT" bench --mode=initiator --segment="$PSEG" --protocol=tcp --block-size=64K \
        --batch-size=8 --duration=0.3 --json >"$TMP/out" 2>"$TMP/err"
    [ "$(field "$TMP/out" target_cpu_s)" = None ] || { cat "$TMP/out"; exit 1; }
    if "$KVT" bench --mode=initiator --segment="$PSEG" --protocol=tcp --block-size=64K \
        --batch-size=8 --duration=0.3 --verify --json >"$TMP/out" 2>"$TMP/err"; then
        echo "--verify against a target that cannot check passed"; exit 1
    fi
    grep -q "needs a kvt bench target" "$TMP/err" || { cat "$TMP/err"; exit 1; }
    echo "a target that does not answer: no target CPU, --verify refused"
    kill "$PYPID"
    wait "$PYPID" 2>/dev/null || true
fi
# A target killed while batches are in flight (--depth 2): the run ends
# soon, reports the failed transfers, and exits 1; it neither hangs on
# the batches still out nor counts them as moved.
"$KVT" bench --mode=target --local=127.0.0.1 --protocol=tcp --buffer-size=64M \
    >"$TMP/target.dying" 2>&1 &
DPID=$!
PIDS="$PIDS $!"
for _ in $(seq 100); do grep -qs '^segment:' "$TMP/target.dying" && break; sleep 0.1; done
DSEG=$(sed -n 's/^segment: *//p' "$TMP/target.dying")
"$KVT" bench --mode=initiator --segment="$DSEG" --protocol=tcp --op=write \
    --block-size=64K --batch-size=64 --depth=2 --duration=20 --json \
    >"$TMP/out" 2>"$TMP/err" &
IPID=$!
PIDS="$PIDS $!"
sleep 1
kill -9 "$DPID"
start=$(date +%s)
rc=0
wait "$IPID" || rc=$?
took=$(( $(date +%s) - start ))
[ "$rc" = 1 ] || { echo "initiator exit $rc, not 1"; cat "$TMP/out" "$TMP/err"; exit 1; }
[ "$took" -le 15 ] || { echo "initiator took $took s after its target died"; exit 1; }
grep -q "transfer failed" "$TMP/err" || { cat "$TMP/err"; exit 1; }
[ "$(field "$TMP/out" errors)" -gt 0 ] || { cat "$TMP/out"; exit 1; }
[ "$(field "$TMP/out" depth)" = 2 ] || { cat "$TMP/out"; exit 1; }
echo "target killed at depth 2: exit 1 after $took s, $(field "$TMP/out" errors) descriptors failed"
echo ok
