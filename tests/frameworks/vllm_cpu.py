# SPDX-License-Identifier: Apache-2.0
"""vLLM's MooncakeConnector, unchanged, made to start on a CPU-only torch.

vLLM 0.32.0's MooncakeConnectorWorker.__init__
(vllm/distributed/kv_transfer/kv_connector/v1/mooncake/mooncake_connector.py,
line 1186) begins with

    self.device_id = torch.accelerator.current_device_index()
    current_platform.set_device(self.device_id)

and with a CPU build of torch, torch.accelerator.current_device_index()
raises "Cannot access accelerator device when none is available". That
line is the only part of the connector that refuses the CPU: the index
only feeds current_platform.set_device(), which on vLLM's CPU platform is
torch.cpu.set_device() (a no-op), and the rest of the connector moves
host memory through TransferEngine as it does device memory. So for the
constructor only, and only where torch has no accelerator, the index
reads 0; every other line runs as vLLM ships it.
"""

import contextlib

import torch
from vllm.distributed.kv_transfer.kv_connector.v1.mooncake import (
    mooncake_connector as _mc)


@contextlib.contextmanager
def _cpu_device_index():
    if torch.accelerator.is_available():
        yield
        return
    real = torch.accelerator.current_device_index
    torch.accelerator.current_device_index = lambda: 0
    try:
        yield
    finally:
        torch.accelerator.current_device_index = real


class MooncakeConnector(_mc.MooncakeConnector):
    def __init__(self, *args, **kwargs):
        with _cpu_device_index():
            super().__init__(*args, **kwargs)
