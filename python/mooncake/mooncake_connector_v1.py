# SPDX-License-Identifier: Apache-2.0
"""Mooncake's vLLM connector module path, served by kvt's vLLM connector.

Mooncake's wheel ships a vLLM KV connector as
``mooncake.mooncake_connector_v1.MooncakeConnector``; deployments point
vLLM at it with ``"kv_connector": "MooncakeConnector",
"kv_connector_module_path": "mooncake.mooncake_connector_v1"``. With kvt's
compatibility package installed that name is kvt's connector
(kvt.vllm.KvtConnector, docs/vllm.md): the same roles, with kvt's
bootstrap server (``bootstrap_addr`` in kv_connector_extra_config) and
layer-wise transfer.
"""

from kvt.vllm import KvtConnector as MooncakeConnector

__all__ = ["MooncakeConnector"]
