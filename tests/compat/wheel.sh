#!/usr/bin/env bash
# SPDX-License-Identifier: Apache-2.0
# The same C scenario against the Mooncake wheel's own C library, when the
# wheel ships one. mooncake-transfer-engine-non-cuda 0.3.13.post1 does not
# (its engine.so exports C++ only), and this says so and skips (77).
#     wheel.sh TEST_PROGRAM WHEEL_DIR
prog=$1 dir=$2
if [ ! -d "$dir" ]; then
    echo "no Mooncake wheel installed at $dir: C scenario not run against Mooncake"
    exit 77
fi
lib=$(find "$dir" -name 'libtransfer_engine.so*' -print -quit)
if [ -z "$lib" ]; then
    echo "the wheel ships no libtransfer_engine.so: C scenario not run against Mooncake"
    exit 77
fi
exec "$prog" "$lib"
