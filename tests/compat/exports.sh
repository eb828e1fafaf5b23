#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# libtransfer_engine.so exports every call of Mooncake's C API: those its
# header declares, and the list Mooncake v0.3.12.post1's header has (so
# that a call dropped from both would still be noticed).
#     exports.sh LIBRARY HEADER
lib=$1 hdr=$2
calls="createTransferEngine discoverTopology getLocalIpAndPort installTransport
uninstallTransport openSegment openSegmentNoCache closeSegment warmupEfaSegment
removeLocalSegment destroyTransferEngine registerLocalMemory
unregisterLocalMemory registerLocalMemoryBatch unregisterLocalMemoryBatch
allocateBatchID submitTransfer submitTransferWithNotify getNotifsFromEngine
freeNotifsMsgBuf genNotifyInEngine getTransferStatus freeBatchID
syncSegmentCache getNicLoadStats enableGracefulShutdown showLinks"
declared=$(grep -oE '^[a-z_]+[ *]+\**([A-Za-z]+)\(' "$hdr" |
    sed -E 's/.*[ *]([A-Za-z]+)\($/\1/')
exported=$(nm -D --defined-only "$lib" | awk '$2 == "T" {print $3}')
[ -n "$exported" ] || { echo "nm -D found nothing in $lib"; exit 1; }
bad=0 n=0
for f in $calls $declared; do
    n=$((n + 1))
    if ! grep -qx "$f" <<<"$exported"; then
        echo "$lib does not export $f"
        bad=1
    fi
done
[ "$(wc -w <<<"$declared")" -ge 27 ] || { echo "header parse found too few calls"; bad=1; }
[ "$bad" = 0 ] && echo "$lib exports all $(wc -w <<<"$calls") calls of Mooncake's C API"
exit "$bad"
