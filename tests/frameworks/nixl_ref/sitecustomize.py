# SPDX-License-Identifier: Apache-2.0
"""NIXL's wheel, the reference of way e, with a progress thread that sleeps.

On the path (before NIXL's wheel) only for the vLLM instances of way e.
NIXL's Python agent runs a UCX progress thread, and nixl_agent sets its
delay (pthrDelay) to 0: the thread polls its UCX workers' event
descriptors with a timeout of 0, a whole CPU for each agent, idle or not
(measured here: one thread per vLLM worker at 100% of a CPU, 80% of it in
the kernel). With a prefill and a decode agent that is both CPUs of a
2-CPU machine, and vLLM's own threads starve: its NIXL handshake, a 5 s
zmq timeout, then expired on the first request in 4 of 9 starts here.
Without the thread (enable_prog_thread=False) an idle prefill instance
stops progressing UCX and a decode's read of its blocks waits forever
(seen here: 300 s, then the request's timeout). So the agents of way e
keep the thread with a delay of 1 ms: it still wakes at once on UCX's
events, and otherwise every millisecond. Nothing else changes; kvt's
engines, in way d, run no thread that spins.

The change is made when the module that defines nixl_agent
(nixl_cu12._api, nixl_cu13._api) is first imported, so that NIXL itself
is imported no earlier than vLLM imports it. (Being first on the path,
this module hides any other sitecustomize; none is installed in build/fw.)"""

import importlib.abc
import sys

_MODULES = ("nixl_cu12._api", "nixl_cu13._api", "nixl_rocm._api")
PTHR_DELAY_US = 1000


class _Bindings:
    """NIXL's bindings module, but for the agent's progress thread delay."""

    def __init__(self, real):
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def nixlAgent(self, name, config):
        config.pthrDelay = PTHR_DELAY_US
        return self._real.nixlAgent(name, config)


def _sleeping_progress_thread(module):
    real = getattr(module, "nixlBind", None)
    if real is None or not hasattr(real, "nixlAgent"):
        raise RuntimeError("NIXL's _api has no nixlBind.nixlAgent: NIXL's "
                           f"wheel changed; see {__file__}")
    module.nixlBind = _Bindings(real)


class _Finder(importlib.abc.MetaPathFinder):
    def find_spec(self, fullname, path, target=None):
        if fullname not in _MODULES:
            return None
        for finder in sys.meta_path:
            if finder is self or not hasattr(finder, "find_spec"):
                continue
            spec = finder.find_spec(fullname, path, target)
            if spec is not None:
                break
        else:
            return None
        run = getattr(spec.loader, "exec_module", None)
        if run is None:
            raise RuntimeError(f"{fullname} has no loader that runs it: "
                               f"NIXL's wheel changed; see {__file__}")

        def exec_module(module):
            run(module)
            _sleeping_progress_thread(module)

        spec.loader.exec_module = exec_module
        return spec


sys.meta_path.insert(0, _Finder())
