#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# ucx transport: kvt bench writes over ucx beside ucx_perftest ucp_put_bw
# (UCX's own put bandwidth test, Debian's ucx-utils) with the same message
# size over the same UCX transports, in alternating rounds in the same run:
# UCX_TLS=tcp (on lo) and UCX_TLS=sm, 1 MiB (batch 32) and 4 KiB (batch
# 128) messages. ucx_perftest reuses one message-sized buffer on each side,
# so kvt runs with --working-set equal to the block size. Both create their
# endpoints with peer failure handling (ucx_perftest -e), and UCX's
# shared-memory transports are asked to handle it (as the tests do). One
# difference stays: ucx_perftest's buffers are allocated by UCX
# (ucp_mem_map ALLOCATE: shared memory its peer maps and copies into
# directly), kvt's target buffer is kvt's own (kvt_mem_alloc), which UCX's
# shared memory reaches only through its active-message copy path (cross-
# memory attach does not handle peer failure). Both figures are MiB/s
# (ucx_perftest's "MB/s" are MiB/s); prints medians and the ratio.
#   bench/ucx.sh [ROUNDS] [SECONDS]      (run from the project root after make)
set -euo pipefail
ROUNDS=${1:-3}
SECS=${2:-3}
KVT=build/bin/kvt
[ -x "$KVT" ] || { echo "run make first"; exit 1; }
"$KVT" info | grep -q 'ucx (' || { echo "kvt is built without ucx"; exit 1; }
command -v ucx_perftest >/dev/null || { echo "ucx_perftest missing (ucx-utils)"; exit 1; }
TMP=$(mktemp -d)
PIDS=()
trap 'for p in "${PIDS[@]}"; do kill "$p" 2>/dev/null || true; done; wait 2>/dev/null; rm -rf "$TMP"' EXIT
export UCX_NET_DEVICES=lo UCX_POSIX_ERROR_HANDLING=y UCX_SYSV_ERROR_HANDLING=y
PORT=$((20000 + RANDOM % 20000))

# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"

# perftest BLOCK ITERS: one ucx_perftest put_bw run; prints MiB/s.
perftest() {
    PORT=$((PORT + 1))
    ucx_perftest -p "$PORT" >"$TMP/pt-server" 2>&1 &
    local srv=$!
    sleep 0.3
    ucx_perftest 127.0.0.1 -p "$PORT" -e -t ucp_put_bw -s "$(numfmt --from=iec "$1")" \
        -n "$2" -w 100 >"$TMP/pt" 2>&1 || { cat "$TMP/pt"; exit 1; }
    wait "$srv" 2>/dev/null || true
    awk '/^Final:/ {print $7}' "$TMP/pt"
}

# kvtrun SEG BLOCK BATCH: one kvt bench run; prints MiB/s.
kvtrun() {
    "$KVT" bench --mode=initiator --segment="$1" --protocol=ucx --op=write \
        --block-size="$2" --batch-size="$3" --working-set="$2" --pattern=contig --threads=1 \
        --duration="$SECS" --json 2>>"$TMP/log" | tail -1 >"$TMP/json"
    python3 -c "import json; d=json.load(open('$TMP/json')); assert d['protocol']=='ucx', d; print(d['gbps'] * 1e9 / 2**20)"
}

printf '%-4s %-6s %6s %14s %18s %7s\n' tls block batch "kvt MiB/s" "perftest MiB/s" ratio
for tls in tcp sm; do
    export UCX_TLS=$tls,self
    "$KVT" bench --mode=target --local=127.0.0.1 --protocol=ucx --buffer-size=64M >"$TMP/target" 2>&1 &
    PIDS+=($!)
    SEG=
    for _ in $(seq 100); do
        SEG=$(sed -n 's/^segment: *//p' "$TMP/target"); [ -n "$SEG" ] && break; sleep 0.1
    done
    [ -n "$SEG" ] || { echo "target did not start"; cat "$TMP/target"; exit 1; }
    for spec in 1M:32 4K:128; do
        blk=${spec%:*}; batch=${spec#*:}
        # About $SECS seconds of ucx_perftest at this machine's rates.
        case $tls-$blk in
        tcp-1M) it=$((SECS * 700)) ;; tcp-4K) it=$((SECS * 150000)) ;;
        sm-1M) it=$((SECS * 20000)) ;; *) it=$((SECS * 3000000)) ;;
        esac
        : >"$TMP/k"; : >"$TMP/p"
        for _ in $(seq "$ROUNDS"); do
            kvtrun "$SEG" "$blk" "$batch" >>"$TMP/k"
            perftest "$blk" "$it" >>"$TMP/p"
        done
        k=$(median <"$TMP/k"); p=$(median <"$TMP/p")
        printf '%-4s %-6s %6s %14.0f %18.0f %7.2f\n' "$tls" "$blk" "$batch" "$k" "$p" \
            "$(python3 -c "print($k/$p)")"
    done
    kill "${PIDS[-1]}"; wait "${PIDS[-1]}" 2>/dev/null || true
done
