#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The KV connector between prefill and decode rank processes on loopback
# (build/bin/kvt_connector_bench), Llama-3-8B-like geometry: 32 layers,
# 8 KV heads of head dim 128 in bf16, 16 tokens per block, 2048-token
# requests (8 MiB of K+V per layer, 256 MiB per request).
#
# 1. Layer-wise latency: compute simulated at COMPUTE_MS per layer; the
#    median time from "last layer ready" on prefill to SUCCESS on decode,
#    beside the whole-request mode (send() after the forward) for the same
#    request, and the bound: one layer's transfer time (whole-request time
#    / layers, same run) + 2 ms.
# 2. Heterogeneous tensor parallelism: throughput of the same bytes with
#    prefill tp != decode tp beside the same-tp pair with as many ranks on
#    each side as the smaller side has (2:1 and 1:2 against 1:1, 4:2 and
#    2:4 against 2:2), for token-major and head-major blocks, and the
#    ratio.
#
# 3. The connector at scale: many small requests at once (--mode=rooms:
#    256 rooms of 16 to 64 tokens per prefill step, 0.05 ms of simulated
#    compute per layer, 32 KiB blocks) beside the engine alone writing the
#    same 32 KiB blocks, scattered and cold (`kvt bench`, two batches of
#    128 in flight), over the same transports, and the ratio. Both keep
#    their caches (the target's buffer) in kvt_mem_alloc() memory, which
#    shm maps.
#
# Each for the engine's transports in PROTOCOLS: "tcp" (tcp only) and
# "auto" (same-host shm where the build has it); with "auto" the
# heterogeneous runs are made twice, the caches in plain memory (malloc)
# and in one kvt_mem_alloc() arena (managed: shm maps it). Runs alternate between
# configurations (REPEATS times) and medians are printed: this machine is
# shared and noisy, ratios hold better than absolute figures.
#   bench/connector.sh [ROUNDS] [REPEATS] [COMPUTE_MS] [PROTOCOLS]
set -euo pipefail
ROUNDS=${1:-7}
REPEATS=${2:-3}
COMPUTE_MS=${3:-10}
PROTOCOLS=${4:-tcp auto}
BIN=build/bin/kvt_connector_bench
KVT=build/bin/kvt
[ -x "$BIN" ] && [ -x "$KVT" ] || { echo "run make first"; exit 1; }
TMP=$(mktemp -d)
trap 'j=$(jobs -p); [ -z "$j" ] || kill $j 2>/dev/null || true; wait 2>/dev/null; rm -rf "$TMP"' EXIT

field() { tr ' ' '\n' | sed -n "s/^$1=//p"; }
# shellcheck source=bench/lib.sh
. "$(dirname "$0")/lib.sh"
# A/B, or n/a when either figure is missing (its runs failed).
ratio() {
    python3 -c "import sys; a, b = (float(x or 0) for x in sys.argv[1:3]); print(f'{a / b:.2f}' if a > 0 and b > 0 else 'n/a')" "$1" "$2"
}
# A failed run is reported with the end of its log and left out; the
# script then ends with status 1.
run() {
    : >"$TMP/log"
    if ! "$BIN" "$@" 2>"$TMP/log"; then
        echo "run failed: $BIN $*" >&2
        : >"$TMP/failed"
        { grep -v WARN "$TMP/log" || true; } | tail -5 >&2
        return 0
    fi
}

for proto in $PROTOCOLS; do
    echo "== [$proto] layer-wise latency (compute ${COMPUTE_MS} ms per layer, $ROUNDS rounds x $REPEATS)"
    : >"$TMP/lw"; : >"$TMP/wh"; : >"$TMP/lt"
    for _ in $(seq "$REPEATS"); do
        out=$(run --mode=latency --protocol="$proto" --rounds="$ROUNDS" \
                  --compute-ms="$COMPUTE_MS")
        echo "$out" | field layerwise_ms >>"$TMP/lw"
        echo "$out" | field whole_ms >>"$TMP/wh"
        echo "$out" | field layer_transfer_ms >>"$TMP/lt"
    done
    lw=$(median <"$TMP/lw"); wh=$(median <"$TMP/wh"); lt=$(median <"$TMP/lt")
    printf '%-36s %10s\n' "layer-wise: last layer -> SUCCESS" "$lw ms"
    printf '%-36s %10s\n' "whole request: send -> SUCCESS" "$wh ms"
    printf '%-36s %10s\n' "one layer's transfer (whole / 32)" "$lt ms"
    printf '%-36s %10s\n' "compute per layer" "$COMPUTE_MS ms"
    python3 - "$lw" "$lt" "$COMPUTE_MS" <<'EOF'
import sys
lw, lt, c = (float(x or 0) for x in sys.argv[1:])
bound = lt + 2.0
if lw <= 0 or lt <= 0:
    print(f"{'bound (one layer + 2 ms)':36s}     n/a (no run gave figures)")
else:
    print(f"{'bound (one layer + 2 ms)':36s} {bound:7.3f} ms: "
          f"{'met' if lw <= bound else 'NOT met'}"
          f"{'' if c > lt else ' (compute per layer is not longer than transfer)'}")
EOF
    echo
    mems=malloc
    [ "$proto" = auto ] && mems="malloc managed"
    for mem in $mems; do
    echo "== [$proto] heterogeneous tp throughput (256 MiB of KV per request, $mem caches)"
    printf '%-7s %-7s %9s %-7s %9s %7s\n' layout hetero "GB/s" same "GB/s" ratio
    for layout in token head; do
        pairs="1:1 2:1 1:2 2:2 4:2 2:4"
        for _ in $(seq "$REPEATS"); do
            for pd in $pairs; do
                run --mode=tp --protocol="$proto" --rounds="$ROUNDS" \
                    --memory="$mem" --layout="$layout" \
                    --prefill-tp="${pd%:*}" --decode-tp="${pd#*:}" |
                    field gbps >>"$TMP/tp_${proto}_${mem}_${layout}_${pd/:/_}"
            done
        done
        for cmp in "2:1 1:1" "1:2 1:1" "4:2 2:2" "2:4 2:2"; do
            set -- $cmp
            h=$(median <"$TMP/tp_${proto}_${mem}_${layout}_${1/:/_}")
            s=$(median <"$TMP/tp_${proto}_${mem}_${layout}_${2/:/_}")
            printf '%-7s %-7s %9s %-7s %9s %7s\n' "$layout" "$1" "$h" "$2" \
                "$s" "$(ratio "$h" "$s")"
        done
    done
    echo
    done
done

# 3. Many small rooms beside the engine alone, same block size and transport.
for proto in $PROTOCOLS; do
    eproto=$([ "$proto" = tcp ] && echo tcp || echo auto)
    echo "== [$proto] many small rooms (256 per step, 16-64 tokens) beside the engine"
    "$KVT" bench --mode=target --local=127.0.0.1 --protocol="$eproto" \
        --buffer-size=1G >"$TMP/target" 2>&1 &
    tpid=$!
    for _ in $(seq 100); do grep -qs '^segment:' "$TMP/target" && break; sleep 0.1; done
    seg=$(sed -n 's/^segment: *//p' "$TMP/target")
    [ -n "$seg" ] || { echo "kvt bench target did not start"; exit 1; }
    : >"$TMP/rc"; : >"$TMP/re"
    for _ in $(seq "$REPEATS"); do
        run --mode=rooms --protocol="$proto" --rounds="$ROUNDS" --memory=managed |
            field gbps >>"$TMP/rc"
        "$KVT" bench --mode=initiator --segment="$seg" --protocol="$eproto" \
            --block-size=32K --pattern=scatter --batch-size=128 --depth=2 \
            --duration=3 --json | tail -1 |
            python3 -c "import json,sys; print(json.load(sys.stdin)['gbps'])" >>"$TMP/re"
    done
    kill "$tpid"; wait "$tpid" 2>/dev/null || true
    c=$(median <"$TMP/rc"); e=$(median <"$TMP/re")
    printf '%-40s %9s GB/s\n' "connector, 256 rooms per step" "$c"
    printf '%-40s %9s GB/s\n' "engine, 32 KiB scattered, cold" "$e"
    printf '%-40s %9s (bar 0.50)\n' "ratio" "$(ratio "$c" "$e")"
    echo
done
[ ! -e "$TMP/failed" ] || { echo "some runs failed (above): their figures are left out"; exit 1; }
