# SPDX-License-Identifier: Apache-2.0
# Wraps the CMake presets: `make` builds into build/, `make test` runs every
# test through CTest, `make demo` runs the demo, `make fuzz SECONDS=N` runs
# each fuzz target N seconds (FUZZ_JOBS at once) in build/fuzz. Each sets
# itself up first (installs Debian packages when run as root). `make soak`
# runs the 10-minute soak under random network faults (KVT_SOAK_SECONDS=N
# to change it), which `make test` leaves out. `make gcc` builds and tests
# with gcc in build/gcc. `make test-frameworks` sets up vLLM and Mooncake
# in build/fw (scripts/frameworks; downloads from PyPI the first time) and
# runs vLLM disaggregated through kvt (tests/frameworks; docs/vllm.md).

BUILD   ?= build
JOBS    ?= $(shell nproc 2>/dev/null || echo 2)
CLANG    = $(shell command -v clang 2>/dev/null)
CC_ARG   = $(if $(CLANG),-DCMAKE_C_COMPILER=$(CLANG),)
ROOT    := $(shell [ "$$(id -u)" = 0 ] && echo yes)
SECONDS ?= 60
FUZZ_JOBS ?= 1

.PHONY: all deps build test demo asan tsan dev gcc fuzz install clean format

all: build

deps:
ifeq ($(ROOT),yes)
	@scripts/install-deps
endif

$(BUILD)/build.ninja: | deps
	cmake --preset release $(CC_ARG) >/dev/null

build: deps $(BUILD)/build.ninja
	cmake --build $(BUILD) -j $(JOBS)

test: build
	ctest --test-dir $(BUILD) --output-on-failure -j $(JOBS) --timeout 600

# The soak belongs to CTest's `soak` configuration, so it runs only when
# asked for by name.
.PHONY: test-frameworks
test-frameworks: build
	KVT_BUILD_DIR=$(BUILD) scripts/frameworks
	cd tests/frameworks && KVT_BIN=$(abspath $(BUILD))/bin/kvt \
	    ../../build/fw/bin/python -m pytest -v -p no:cacheprovider \
	    test_connector_parts.py test_mooncake_compat.py test_vllm.py
	# NIXL's agent API: the same suite against kvt's nixl (kvt's choice of
	# transport, then tcp) and NIXL's wheel (UCX over tcp, then over
	# shared memory with tcp for its control messages).
	# A run on NIXL's wheel that fails is run once more (the reference's
	# own hiccups, e.g. a peer it crashed, should not fail kvt's CI); a
	# second failure fails.
	cd tests/nixl && export KVT_NIXL_HOST=127.0.0.1 && \
	    ../../build/fw/bin/python -m pytest -q -p no:cacheprovider . && \
	    KVT_NIXL_PROTOCOL=tcp ../../build/fw/bin/python -m pytest -q \
	        -p no:cacheprovider . && \
	    for tls in tcp shm,tcp; do \
	        PYTHONPATH=../../build/fw/nixl-real UCX_TLS=$$tls \
	            ../../build/fw/bin/python -m pytest -q -p no:cacheprovider . \
	        || { echo "NIXL's wheel, UCX_TLS=$$tls: failed; once more"; \
	             PYTHONPATH=../../build/fw/nixl-real UCX_TLS=$$tls \
	             ../../build/fw/bin/python -m pytest -q -p no:cacheprovider \
	             . ; } || exit 1; \
	    done

.PHONY: soak
soak: build
	ctest --test-dir $(BUILD) -C soak -L soak -V

demo: build
	$(BUILD)/bin/kvt demo

dev asan tsan: deps
	cmake --preset $@ $(CC_ARG) >/dev/null
	cmake --build --preset $@ -j $(JOBS)
	ctest --preset $@ -j $(JOBS)

# The release build and every test with gcc (most users' cc), whichever
# compiler `make` picks.
gcc: deps
	cmake --preset gcc >/dev/null
	cmake --build --preset gcc -j $(JOBS)
	ctest --preset gcc -j $(JOBS) --timeout 600

fuzz: deps
	scripts/fuzz --jobs $(FUZZ_JOBS) $(SECONDS)

install: build
	cmake --install $(BUILD)

format:
	clang-format -i $$(git ls-files '*.c' '*.h')

clean:
	rm -rf $(BUILD)
