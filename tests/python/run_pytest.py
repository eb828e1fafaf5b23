# SPDX-License-Identifier: Apache-2.0
"""CTest's entry to the Python tests: run pytest on the arguments.

Exits 77 (CTest's skip code here) when pytest is not installed or when it
collected nothing (its exit code 5), so a machine without
python3-pytest skips these tests instead of failing them.
"""

import sys

try:
    import pytest
except ImportError:
    print("pytest is not installed (Debian: apt-get install python3-pytest);"
          " skipping")
    sys.exit(77)

rc = int(pytest.main(sys.argv[1:]))
if rc == 5:  # pytest.ExitCode.NO_TESTS_COLLECTED
    print("pytest collected no tests; reporting a skip")
    sys.exit(77)
sys.exit(rc)
