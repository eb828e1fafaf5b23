# SPDX-License-Identifier: Apache-2.0
"""Build and install kvt's Python packages: the kvt package with its C
extension (kvt._kvt, built by CMake against the CPython limited API, so
one abi3 wheel serves every CPython >= 3.11) and, when asked, the
``mooncake`` and ``nixl`` compatibility packages.

The ``mooncake`` package is installed only with KVT_MOONCAKE_SHIM=1 in
the environment, and the ``nixl`` package only with KVT_NIXL_SHIM=1, so
that installing kvt never shadows (or overwrites) a real Mooncake or
NIXL installation; without them, kvt.TransferEngine and kvt.nixl are
the same code. KVT_BUILD_DIR names an existing CMake build tree to take the
extension from instead of building one; CMAKE_ARGS adds options.
"""

import os
import pathlib
import re
import shutil
import subprocess
import sys

from setuptools import Extension, setup
from setuptools.command.build_ext import build_ext

HERE = pathlib.Path(__file__).resolve().parent


def version():
    """The one version number: include/kvt/defs.h (CMake reads it too)."""
    text = (HERE / "include" / "kvt" / "defs.h").read_text()
    parts = [re.search(rf"#define KVT_VERSION_{p} (\d+)", text).group(1)
             for p in ("MAJOR", "MINOR", "PATCH")]
    return ".".join(parts)


class CMakeBuild(build_ext):
    """Builds kvt._kvt with CMake (or takes it from KVT_BUILD_DIR)."""

    def build_extension(self, ext):
        out = pathlib.Path(self.get_ext_fullpath(ext.name)).resolve()
        tree = os.environ.get("KVT_BUILD_DIR")
        if tree:
            build = pathlib.Path(tree).resolve()
        else:
            build = pathlib.Path(self.build_temp).resolve() / "cmake"
            build.mkdir(parents=True, exist_ok=True)
            args = ["-DKVT_BUILD_TESTS=OFF", "-DKVT_BUILD_FUZZ=OFF",
                    "-DCMAKE_BUILD_TYPE=Release",
                    f"-DPython3_EXECUTABLE={sys.executable}"]
            args += os.environ.get("CMAKE_ARGS", "").split()
            subprocess.run(["cmake", "-S", str(HERE), "-B", str(build)]
                           + args, check=True)
            jobs = str(os.cpu_count() or 1)
            subprocess.run(["cmake", "--build", str(build), "--target",
                            "kvt_python", "-j", jobs], check=True)
        built = build / "python" / "kvt" / "_kvt.abi3.so"
        if not built.exists():
            raise RuntimeError(f"kvt: {built} was not built (is "
                               "python3-dev installed?)")
        out.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(built, out)


packages = ["kvt", "kvt.vllm", "kvt.nixl"]
if os.environ.get("KVT_MOONCAKE_SHIM") == "1":
    packages.append("mooncake")
if os.environ.get("KVT_NIXL_SHIM") == "1":
    packages.append("nixl")

# setuptools' own files go under build/setuptools (out of CMake's way),
# a folder for each set of packages: setuptools reuses what it finds in
# build/lib, so a build with the mooncake package would leave it in the
# next build without. egg_info needs the folder to exist.
SETUPTOOLS_DIR = "build/setuptools" + "".join(
    "-" + p for p in ("mooncake", "nixl") if p in packages)
(HERE / SETUPTOOLS_DIR).mkdir(parents=True, exist_ok=True)

setup(
    version=version(),
    packages=packages,
    package_dir={"": "python"},
    ext_modules=[Extension("kvt._kvt", sources=[], py_limited_api=True)],
    cmdclass={"build_ext": CMakeBuild},
    options={"bdist_wheel": {"py_limited_api": "cp311"},
             # Out of the way of CMake's build/ (its intermediate files).
             "build": {"build_base": SETUPTOOLS_DIR},
             "egg_info": {"egg_base": SETUPTOOLS_DIR}},
    zip_safe=False,
)
