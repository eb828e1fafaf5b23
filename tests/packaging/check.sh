#!/bin/sh
# SPDX-License-Identifier: Apache-2.0
# Install the build into a staging root (DESTDIR), then build and run a
# program outside the tree against it twice: through find_package(kvt)
# and through pkg-config. Both must print the version the build has.
#   check.sh BUILD_DIR SOURCE_DIR VERSION
set -eu
BUILD=$1
SRC=$2
VERSION=$3
TMP=$(mktemp -d)
trap 'rm -rf "$TMP"' EXIT
DESTDIR="$TMP/root" cmake --install "$BUILD" >/dev/null
PREFIX=$(sed -n 's/^CMAKE_INSTALL_PREFIX:PATH=//p' "$BUILD/CMakeCache.txt")
LIBDIR=$(sed -n 's/^CMAKE_INSTALL_LIBDIR:PATH=//p' "$BUILD/CMakeCache.txt")
ROOT="$TMP/root$PREFIX"
LIB="$ROOT/$LIBDIR"
[ -f "$SRC/LICENSE" ] && [ -f "$ROOT/share/doc/kvt/LICENSE" ]
ls "$LIB"/libkvt.so.* >/dev/null

# find_package(kvt) and kvt::kvt.
cmake -S "$SRC/tests/packaging/consumer" -B "$TMP/cm" \
    -DCMAKE_PREFIX_PATH="$ROOT" >/dev/null
cmake --build "$TMP/cm" >/dev/null
out=$(LD_LIBRARY_PATH="$LIB" "$TMP/cm/consumer")
[ "$out" = "kvt $VERSION" ] || { echo "cmake consumer: $out"; exit 1; }

# pkg-config, from the staged root (the .pc file finds its prefix).
export PKG_CONFIG_PATH="$LIB/pkgconfig"
[ "$(pkg-config --modversion kvt)" = "$VERSION" ]
cc -o "$TMP/pc" "$SRC/tests/packaging/consumer/main.c" \
    $(pkg-config --cflags --libs kvt)
out=$(LD_LIBRARY_PATH="$LIB" "$TMP/pc")
[ "$out" = "kvt $VERSION" ] || { echo "pkg-config consumer: $out"; exit 1; }
# The SONAME the policy gives (docs/packaging.md).
soname=$(objdump -p "$LIB/libkvt.so" | sed -n 's/ *SONAME *//p')
case "$VERSION" in
0.*) want="libkvt.so.0.$(echo "$VERSION" | cut -d. -f2)" ;;
*) want="libkvt.so.$(echo "$VERSION" | cut -d. -f1)" ;;
esac
[ "$soname" = "$want" ] || { echo "SONAME $soname, want $want"; exit 1; }
echo "ok: kvt $VERSION through find_package and pkg-config ($soname)"
