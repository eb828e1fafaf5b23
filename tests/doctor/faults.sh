#!/bin/bash
# SPDX-License-Identifier: Apache-2.0
#
# kvt doctor against real faults, each made in network namespaces of this
# test's own: host A (the doctor, 10.78.1.1) and host B (the peers,
# 10.78.1.2, in a pid namespace of their own too, so that kvt sees another
# host), joined by a veth pair created inside them. Each fault must be
# named as that fault, with its fix, within 10 s, and the doctor must exit
# 1; a healthy pair must report every transport with its figures and exit
# 0, its --json parsing. Every case's output is printed.
#
#   tests/doctor/faults.sh KVT_BIN CUDA_DOUBLE [CMAKE SOURCE_DIR BUILD_DIR CC]
#
# Needs root and ip(8), iptables(8), unshare(1), python3; exits 77 (skip)
# without them. With CMAKE...: the kvt tool is also built without UCX into
# BUILD_DIR, for "ucx requested where it is not built" (skipped without).
set -u
KVT=$1
DOUBLE=$2
NOUCX=
HERE=$(cd "$(dirname "$0")" && pwd)

if [ "$(id -u)" != 0 ]; then
    echo "skip: not root (network namespaces need CAP_NET_ADMIN)"
    exit 77
fi
for t in ip iptables unshare python3 timeout; do
    command -v $t >/dev/null || { echo "skip: no $t"; exit 77; }
done

A=kvtd$$-a
B=kvtd$$-b
LOG=$(mktemp -d /tmp/kvt-doctor-faults.XXXXXX)
failures=0

cleanup() {
    for ns in $B $A; do
        for p in $(ip netns pids $ns 2>/dev/null); do kill -9 $p 2>/dev/null; done
        ip netns del $ns 2>/dev/null
    done
    rm -rf "$LOG"
}
trap cleanup EXIT
trap 'exit 1' INT TERM

# Worlds of runs that died without cleaning up.
for ns in $(ip netns list | awk '{print $1}' | grep '^kvtd[0-9]*-[ab]$'); do
    pid=${ns#kvtd}; pid=${pid%-*}
    kill -0 $pid 2>/dev/null || ip netns del $ns
done

if [ $# -ge 6 ]; then
    echo "=== building the kvt tool without UCX into $5"
    if "$3" -S "$4" -B "$5" -DKVT_WITH_UCX=OFF -DKVT_BUILD_TESTS=OFF \
        -DKVT_BUILD_FUZZ=OFF -DKVT_BUILD_PYTHON=OFF -DCMAKE_C_COMPILER="$6" \
        >"$LOG/noucx.log" 2>&1 &&
        "$3" --build "$5" --target kvt_cli -j2 >>"$LOG/noucx.log" 2>&1; then
        NOUCX=$5/bin/kvt
    else
        tail -20 "$LOG/noucx.log"
        echo "!!! cannot build kvt without UCX"
        failures=$((failures + 1))
    fi
fi

ip netns add $A && ip netns add $B || exit 1
ip -n $A link add kd$$a type veth peer name kd$$b netns $B || exit 1
ip -n $A addr add 10.78.1.1/24 dev kd$$a
ip -n $B addr add 10.78.1.2/24 dev kd$$b
for ns in $A $B; do ip -n $ns link set lo up; done
ip -n $A link set kd$$a up
ip -n $B link set kd$$b up
# UCX leaves out interfaces that are not up yet.
for _ in $(seq 100); do
    [ "$(ip netns exec $A cat /sys/class/net/kd$$a/operstate)" = up ] &&
        [ "$(ip netns exec $B cat /sys/class/net/kd$$b/operstate)" = up ] && break
    sleep 0.05
done

# UCX over the link, as between two hosts: its tcp transport on the veth
# (its shared-memory transports would bypass the link on one machine).
export UCX_TLS=tcp
inA() { UCX_NET_DEVICES=kd$$a ip netns exec $A "$@"; }
inB() { UCX_NET_DEVICES=kd$$b ip netns exec $B unshare --pid --fork "$@"; }

# Start a peer in B; wait until its port answers.
peer() { # NAME PORT CMD...
    local name=$1 port=$2
    shift 2
    inB "$@" >"$LOG/$name.out" 2>&1 &
    for _ in $(seq 100); do
        inA bash -c "exec 3<>/dev/tcp/10.78.1.2/$port" 2>/dev/null && return 0
        sleep 0.05
    done
    echo "peer $name did not start:"; cat "$LOG/$name.out"
    return 1
}
stop_peers() {
    for p in $(ip netns pids $B 2>/dev/null); do kill -9 $p 2>/dev/null; done
    sleep 0.1
}

# One case: the doctor in A must exit WANT_RC within 10 s and print every
# pattern given.
case_() { # NAME WANT_RC PATTERNS... -- DOCTOR ARGS...
    local name=$1 want=$2 pats=() t0 t1 rc secs
    shift 2
    while [ "$1" != "--" ]; do pats+=("$1"); shift; done
    shift
    t0=$(date +%s.%N)
    inA timeout 20 "$@" >"$LOG/case.out" 2>&1
    rc=$?
    t1=$(date +%s.%N)
    secs=$(python3 -c "print('%.2f' % ($t1 - $t0))")
    echo "=== $name: exit $rc in $secs s: $*" | sed "s|$KVT|kvt|; s|${NOUCX:-/nonexistent-}|kvt|"
    cat "$LOG/case.out"
    local ok=1
    [ "$rc" = "$want" ] || { echo "!!! exit status $rc, wanted $want"; ok=0; }
    python3 -c "import sys; sys.exit(0 if $secs < 10 else 1)" ||
        { echo "!!! took $secs s (over 10 s)"; ok=0; }
    for p in "${pats[@]}"; do
        grep -qE -- "$p" "$LOG/case.out" || { echo "!!! no line matches: $p"; ok=0; }
    done
    [ $ok = 1 ] || failures=$((failures + 1))
}

META=http://10.78.1.1:17100/metadata
inA "$KVT" metad --host 10.78.1.1 --port 17100 >"$LOG/metad.out" 2>&1 &
for _ in $(seq 100); do
    inA bash -c "exec 3<>/dev/tcp/10.78.1.1/17100" 2>/dev/null && break
    sleep 0.05
done

# 1. A healthy pair: every transport it runs, with figures; --json parses.
peer healthy 17001 "$KVT" doctor --serve --host 10.78.1.2 --port 17001 \
    --transports tcp,ucx || failures=$((failures + 1))
case_ "healthy pair (plain)" 0 \
    '^ok +host.transport.ucx .*; UCX [0-9.]+: .*tcp/kd[0-9]+a' \
    '^ok +peer.transfer.tcp .*verified \[[0-9]+ MB/s writing, [0-9.]+ us' \
    '^ok +peer.transfer.ucx .*verified \[[0-9]+ MB/s writing, [0-9.]+ us' \
    '^ok +peer.select.host-host +host->host: ucx \(the highest priority of the 2 that serve it\); tcp: serves it too' \
    '0 failed' -- \
    "$KVT" doctor 10.78.1.2:17001 --host 10.78.1.1 --transports tcp,ucx \
    --probe 16M
inA "$KVT" doctor 10.78.1.2:17001 --host 10.78.1.1 --transports tcp,ucx \
    --probe 16M --json >"$LOG/healthy.json" 2>"$LOG/healthy.err"
rc=$?
echo "=== healthy pair (--json): exit $rc"
cat "$LOG/healthy.err"
if ! python3 - "$LOG/healthy.json" <<'EOF'
import json, sys
r = json.load(open(sys.argv[1]))
t = {c["id"]: c for c in r["checks"]}
assert r["ok"] is True, r
for tl in ("tcp", "ucx"):
    c = t["peer.transfer." + tl]
    assert c["level"] == "ok" and c["mbps"] > 0 and c["lat_us"] > 0, c
    print("%s: %.0f MB/s writing, %.1f us per 64-byte read" %
          (tl, c["mbps"], c["lat_us"]))
print("%d checks parsed" % len(r["checks"]))
EOF
then
    failures=$((failures + 1))
fi
[ $rc = 0 ] || { echo "!!! exit status $rc"; failures=$((failures + 1)); }
stop_peers

# 2. The peer advertises a name that resolves to loopback, from another
#    host: it listens on 127.0.0.1 and publishes that.
inB "$KVT" doctor --serve --host 127.0.0.1 --port 17002 --metadata $META \
    >"$LOG/loopback.out" 2>&1 &
for _ in $(seq 100); do
    grep -q serving "$LOG/loopback.out" 2>/dev/null && break
    sleep 0.05
done
sleep 0.3 # its descriptor published
case_ "advertised name resolves to 127.0.0.1 on another host" 1 \
    '^FAIL +peer.advertised .*127.0.0.1 \(loopback\), but the peer runs on another host' \
    'fix: start the peer with local_host set to an address other hosts reach' -- \
    "$KVT" doctor 127.0.0.1:17002 --metadata $META --host 10.78.1.1
stop_peers

# 3. The data ports dropped by the firewall while the control port
#    answers: UCX's own ports, in B.
peer dataport 17003 "$KVT" doctor --serve --host 10.78.1.2 --port 17003 \
    --transports tcp,ucx || failures=$((failures + 1))
ip netns exec $B iptables -A INPUT -p tcp --syn ! --dport 17003 -j DROP
case_ "data port dropped, control port answers" 1 \
    '^ok +peer.control ' '^ok +peer.handshake ' \
    '^FAIL +peer.transfer.ucx .*control port answered, but the data path did not' \
    'fix: let TCP from this host to the peer.s UCX ports through the firewall' -- \
    "$KVT" doctor 10.78.1.2:17003 --host 10.78.1.1 --transports tcp,ucx \
    --timeout 2 --probe 16M
ip netns exec $B iptables -F INPUT
stop_peers

# 4. Token mismatch.
peer token 17004 env KVT_AUTH_TOKEN=the-peers-secret "$KVT" doctor --serve \
    --host 10.78.1.2 --port 17004 || failures=$((failures + 1))
case_ "token mismatch" 1 \
    '^FAIL +peer.auth .*different auth tokens \(token mismatch\)' \
    'fix: give both sides the same KVT_AUTH_TOKEN' -- \
    "$KVT" doctor 10.78.1.2:17004 --host 10.78.1.1 --auth-token another-secret
case_ "token missing" 1 \
    '^FAIL +peer.auth .*requires an auth token and this side has none' -- \
    env -u KVT_AUTH_TOKEN "$KVT" doctor 10.78.1.2:17004 --host 10.78.1.1
stop_peers

# 5. A peer speaking another wire version.
peer version 17005 python3 "$HERE/other_version_peer.py" 10.78.1.2 17005 ||
    failures=$((failures + 1))
case_ "another wire version" 1 \
    '^FAIL +peer.version .*speaks kvt wire protocol 3.0, this side 2\.' \
    'fix: run kvt of the same wire protocol.s major version on both sides' -- \
    "$KVT" doctor 10.78.1.2:17005 --host 10.78.1.1
stop_peers

# 6. A metadata entry left behind by a peer that restarted on another
#    port: killed (nothing unpublished), then started again elsewhere.
peer stale1 17006 "$KVT" doctor --serve --host 10.78.1.2 --port 17006 \
    --metadata $META || failures=$((failures + 1))
sleep 0.3
stop_peers
peer stale2 17007 "$KVT" doctor --serve --host 10.78.1.2 --port 17007 \
    --metadata $META || failures=$((failures + 1))
case_ "stale metadata entry" 1 \
    '^ok +metadata.entry ' \
    '^FAIL +metadata.stale .*is stale: it names 10.78.1.2:17006.*nothing listens now' \
    'fix: restart the peer so that it publishes again, or delete the key' -- \
    "$KVT" doctor 10.78.1.2:17006 --metadata $META --host 10.78.1.1
stop_peers

# 7. ucx requested where it is not built.
if [ -n "$NOUCX" ]; then
    case_ "ucx requested where it is not built" 1 \
        '^FAIL +host.transport.ucx +ucx was requested, but this library was built without it' \
        'fix: install UCX' -- \
        "$NOUCX" doctor --host 10.78.1.1 --transports tcp,ucx
else
    echo "=== ucx requested where it is not built: skipped (no kvt without UCX given)"
fi

# 8. Device memory requested, with and without a driver (the test double).
if [ "$DOUBLE" != none ]; then
    peer cuda 17008 env KVT_CUDA_LIBRARY="$DOUBLE" "$KVT" doctor --serve \
        --host 10.78.1.2 --port 17008 || failures=$((failures + 1))
    case_ "device memory with the driver (test double)" 0 \
        '^ok +host.memory.cuda +driver [0-9.]+, [0-9]+ devices; device memory registers' \
        '^ok +host.memory.cuda.tcp +device memory registers for tcp' \
        '^ok +peer.select.cuda-host +cuda->host: tcp \(one transport for every kind of memory in use.*device memory staged through pinned host memory\)' -- \
        env KVT_CUDA_LIBRARY="$DOUBLE" "$KVT" doctor 10.78.1.2:17008 \
        --host 10.78.1.1 --mem host,cuda --probe 1M
    stop_peers
fi
case_ "device memory without a driver" 1 \
    '^FAIL +host.memory.cuda +device memory was requested, but it cannot be registered here: no CUDA driver' \
    'fix: install the NVIDIA driver' -- \
    env KVT_CUDA_LIBRARY=/nonexistent/libcuda.so.1 "$KVT" doctor \
    --host 10.78.1.1 --mem host,cuda

if [ $failures != 0 ]; then
    echo "$failures case(s) failed"
    exit 1
fi
echo "every case named as expected"
