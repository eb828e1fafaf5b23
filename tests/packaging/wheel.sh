#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# The Python package: an abi3 wheel built with `python3 -m build` (offline,
# Debian's setuptools; the extension taken from this build tree), installed
# into a fresh virtual environment, then used from two processes of that
# environment: one writes bytes into the other's memory, which checks them.
# Without KVT_MOONCAKE_SHIM=1 the wheel has no mooncake package, and
# without KVT_NIXL_SHIM=1 no nixl package.
#   wheel.sh BUILD_DIR SOURCE_DIR PYTHON
set -eu
BUILD=$1
SRC=$2
PY=$3
TMP=$(mktemp -d)
PIDS=
# (`kill $(jobs -p)` kills nothing under dash: the list is empty there.)
trap 'kill $PIDS 2>/dev/null || true; rm -rf "$TMP"' EXIT
"$PY" -c "import build, setuptools, venv" 2>/dev/null || {
    echo "skipped: python3-build or python3-venv missing"; exit 77; }
cd "$SRC"
KVT_BUILD_DIR="$BUILD" "$PY" -m build --wheel --no-isolation \
    --outdir "$TMP/dist" . >"$TMP/build.log" 2>&1 || {
    cat "$TMP/build.log"; exit 1; }
whl=$(ls "$TMP"/dist/kvt-*-cp311-abi3-*.whl)
"$PY" -m venv "$TMP/venv"
"$TMP/venv/bin/pip" install --quiet --no-index --no-deps "$whl"
cd "$TMP"
V="$TMP/venv/bin/python"
env -u PYTHONPATH "$V" -c "
import kvt, sys
assert kvt.__file__.startswith('$TMP/venv/'), kvt.__file__
try:
    import mooncake
    sys.exit('mooncake installed without KVT_MOONCAKE_SHIM=1')
except ImportError:
    pass
try:
    import nixl
    sys.exit('nixl installed without KVT_NIXL_SHIM=1')
except ImportError:
    pass
print(kvt.__version__)"

cat >"$TMP/target.py" <<'PYEOF'
import ctypes, mmap, sys
import kvt
e = kvt.TransferEngine()
assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
buf = mmap.mmap(-1, 1 << 20)
addr = ctypes.addressof(ctypes.c_char.from_buffer(buf))
assert e.register_memory(addr, 1 << 20) == 0
print(f"127.0.0.1:{e.get_rpc_port()} {addr}", flush=True)
sys.stdin.readline()
print(bytes(buf[:11]).decode(), flush=True)
PYEOF
cat >"$TMP/initiator.py" <<'PYEOF'
import ctypes, mmap, sys
import kvt
seg, addr = sys.argv[1], int(sys.argv[2])
e = kvt.TransferEngine()
assert e.initialize("127.0.0.1", "P2PHANDSHAKE", "tcp", "") == 0
buf = mmap.mmap(-1, 4096)
buf[:11] = b"hello-wheel"
src = ctypes.addressof(ctypes.c_char.from_buffer(buf))
assert e.register_memory(src, 4096) == 0
assert e.transfer_sync_write(seg, src, addr, 11) == 0
assert e.get_metrics()["transports"]["tcp"]["writes"] == 1
PYEOF
mkfifo "$TMP/in"
env -u PYTHONPATH "$V" "$TMP/target.py" <"$TMP/in" >"$TMP/out" &
PIDS="$PIDS $!"
exec 3>"$TMP/in"
for _ in $(seq 100); do [ -s "$TMP/out" ] && break; sleep 0.1; done
read -r seg addr <"$TMP/out"
env -u PYTHONPATH "$V" "$TMP/initiator.py" "$seg" "$addr"
echo >&3
exec 3>&-
wait
[ "$(sed -n 2p "$TMP/out")" = "hello-wheel" ] || { cat "$TMP/out"; exit 1; }
echo "ok: $(basename "$whl") in a fresh venv, used from two processes"
