#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# kvt stats against a running kvt bench: the initiator and the target
# serve /metrics (KVT_METRICS_PORT); two refreshes of kvt stats must show
# the initiator's transport with bytes moving, and the target serving
# them (one-sided writes counted where they land); the table's columns on
# a terminal are not needed here (plain lines when stdout is not one).
#   stats.sh KVT
set -eu
KVT=$1
TMP=$(mktemp -d)
PIDS=
# (`kill $(jobs -p)` kills nothing under dash: the list is empty there.)
trap 'kill $PIDS 2>/dev/null || true; rm -rf "$TMP"' EXIT
TPORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
KVT_METRICS_PORT=$TPORT "$KVT" bench --mode=target --local=127.0.0.1 \
    --protocol=tcp --buffer-size=64M >"$TMP/target" 2>&1 &
PIDS="$PIDS $!"
for _ in $(seq 100); do grep -qs '^segment:' "$TMP/target" && break; sleep 0.1; done
SEG=$(sed -n 's/^segment: *//p' "$TMP/target")
[ -n "$SEG" ] || { cat "$TMP/target"; exit 1; }
# A free port for the initiator's listener.
PORT=$(python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1",0)); print(s.getsockname()[1])')
KVT_METRICS_PORT=$PORT "$KVT" bench --mode=initiator --segment="$SEG" \
    --protocol=tcp --block-size=64K --batch-size=16 --duration=8 \
    >"$TMP/ini" 2>&1 &
PIDS="$PIDS $!"
sleep 1
"$KVT" stats --count=2 --interval=1 "127.0.0.1:$PORT" >"$TMP/out"
cat "$TMP/out"
# Two refreshes, each with a tcp line moving bytes.
[ "$(grep -c 'transport=tcp ' "$TMP/out")" = 2 ]
grep 'transport=tcp ' "$TMP/out" | awk '{
    for (i = 1; i <= NF; i++) if ($i ~ /^write_MBps=/) {
        split($i, a, "="); if (a[2] + 0 <= 0) exit 1 } }'
# The target: nothing of its own moving, peers' writes served.
"$KVT" stats --count=2 --interval=1 "127.0.0.1:$TPORT" >"$TMP/tout"
cat "$TMP/tout"
[ "$(grep -c 'transport=tcp ' "$TMP/tout")" = 2 ]
grep 'transport=tcp ' "$TMP/tout" | tail -1 | awk '{
    for (i = 1; i <= NF; i++) {
        split($i, a, "=")
        if (a[1] == "served_write_MBps" && a[2] + 0 <= 0) exit 1
        if (a[1] == "write_MBps" && a[2] + 0 != 0) exit 1 } }'
# A process that does not answer is an error, said once.
if "$KVT" stats --count=1 127.0.0.1:1 2>"$TMP/err"; then exit 1; fi
grep -q "no answer" "$TMP/err"
echo "ok"
