# SPDX-License-Identifier: Apache-2.0
"""kvt for vLLM: ``KvtConnector``, a vLLM KV connector (KVConnectorBase_V1)
on kvt's C connector, and ``kvt.vllm.proxy``, a small prefill/decode proxy.

vLLM loads the connector by module path::

    --kv-transfer-config '{"kv_connector": "KvtConnector",
        "kv_connector_module_path": "kvt.vllm",
        "kv_role": "kv_producer",            # prefill; decode: kv_consumer
        "kv_connector_extra_config": {"bootstrap_addr": "127.0.0.1:8998"}}'

docs/vllm.md has the flow, the options and what each side does. The
connector is imported on first use, so that ``python -m kvt.vllm.proxy``
does not load vLLM.
"""

__all__ = ["KvtConnector", "room_of"]


def __getattr__(name):
    if name in __all__:
        from kvt.vllm import connector
        return getattr(connector, name)
    raise AttributeError(f"module 'kvt.vllm' has no attribute {name!r}")
