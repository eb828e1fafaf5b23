# SPDX-License-Identifier: Apache-2.0
"""vLLM prefill/decode disaggregation through kvt, against one plain vLLM
instance: every way's greedy outputs must be the reference's, token for
token.

- a: vLLM's MooncakeConnector with mooncake.engine = kvt's drop-in;
- b: the same on Mooncake's own wheel (the reference transfer engine);
- c: kvt's KvtConnector (layer-wise, kvt metad for rendezvous), also
  with prefill TP 2 and decode TP 1 (through the module path
  mooncake.mooncake_connector_v1) and the reverse;
- a prefill instance killed in the middle of a batch, for a and c.

Run by `make test-frameworks` (scripts/frameworks sets up build/fw).
"""

import concurrent.futures
import time

import pytest

import cluster
from cluster import Metad, Proxy, Vllm, complete, free_port, http, metric
from prompts import cached_blocks, prompt_set

PROMPTS = prompt_set()
MAX_TOKENS = 32
# K and V of one block of one layer, all KV heads: 2 heads x 32 tokens x
# (2 x 32 floats) x 4 bytes.
BLOCK_LAYER_BYTES = 2 * cluster.BLOCK_SIZE * 2 * 32 * 4
LAYERS = 4
# Transfer timeout of the kill tests (kvt's connector and the proxy).
TRANSFER_TIMEOUT_S = 30


def run_prompts(url, prompts=PROMPTS):
    out = []
    for p in prompts:
        status, toks = complete(url, p, MAX_TOKENS)
        assert status == 200, f"prompt of {len(p)} tokens: {toks}"
        out.append(toks)
    return out


def expect_same(got, want, what):
    bad = [i for i, (g, w) in enumerate(zip(got, want)) if g != w]
    assert not bad, (f"{what}: {len(bad)} of {len(want)} outputs differ "
                     f"from one plain instance; first, prompt {bad[0]} "
                     f"({len(PROMPTS[bad[0]])} tokens): {got[bad[0]]} "
                     f"against {want[bad[0]]}")
    assert len(got) == len(want)


def expected_kv_bytes(prompts):
    """The KV of each prompt's blocks that decode's prefix cache does not
    hold already (the prompts sent one at a time, in order)."""
    bs = cluster.BLOCK_SIZE
    blocks = sum(-(-len(p) // bs) - c
                 for p, c in zip(prompts, cached_blocks(prompts, bs)))
    return blocks * BLOCK_LAYER_BYTES * LAYERS


class Pair:
    """A prefill and a decode instance and a proxy between them."""

    def __init__(self, tag, kind, flow, ptp=1, dtp=1, extra=None,
                 alias=False):
        self.tag, self.kind, self.flow = tag, kind, flow
        self.ptp, self.dtp, self.alias = ptp, dtp, alias
        self.metad = Metad(f"{tag}-metad") if kind == "kvt" else None
        self.extra = dict(extra or {})
        if self.metad:
            self.extra["bootstrap_addr"] = self.metad.addr
        self.prefill = self._start("prefill", ptp)
        self.decode = Vllm(f"{tag}-decode", kind, "decode", tp=dtp,
                           extra=self.extra, metrics_port=free_port(),
                           alias=alias)
        self.prefill.wait()
        self.decode.wait()
        self.proxy = Proxy(f"{tag}-proxy", self.prefill, self.decode, flow,
                           timeout=TRANSFER_TIMEOUT_S * 2)

    def _start(self, role, tp, like=None):
        return Vllm(f"{self.tag}-{role}", self.kind, role, tp=tp,
                    extra=self.extra,
                    metrics_port=None if like else free_port(),
                    like=like, alias=self.alias)

    def restart_prefill(self):
        old = self.prefill
        old.stop()
        self.prefill = self._start("prefill", self.ptp, like=old)
        self.prefill.wait()

    def bytes_written(self):
        """KV bytes prefill's kvt engines wrote (every rank)."""
        return sum(metric(self.prefill.metrics_port + r,
                          "kvt_transfer_bytes_total", op="write")
                   for r in range(self.ptp if self.kind == "kvt" else 1))

    def stop(self):
        for p in (self.proxy, self.prefill, self.decode, self.metad):
            if p is not None:
                p.stop()


@pytest.fixture(scope="module")
def reference():
    plain = Vllm("plain")
    try:
        plain.wait()
        return run_prompts(plain.url)
    finally:
        plain.stop()


def test_prompt_set():
    lens = [len(p) for p in PROMPTS]
    assert len(PROMPTS) >= 32 and min(lens) == 5 and max(lens) == 2000
    assert sum(c >= 4 for c in cached_blocks(PROMPTS,
                                             cluster.BLOCK_SIZE)) >= 6


def test_a_mooncake_connector_on_kvt(reference):
    pair = Pair("a", "mooncake-kvt", "mooncake")
    try:
        expect_same(run_prompts(pair.proxy.url), reference, "a")
        moved = pair.bytes_written()
        assert moved == expected_kv_bytes(PROMPTS), moved
    finally:
        pair.stop()


def test_b_mooncake_connector_on_mooncake(reference):
    pair = Pair("b", "mooncake-real", "mooncake")
    try:
        expect_same(run_prompts(pair.proxy.url), reference, "b")
    finally:
        pair.stop()


def test_c_kvt_connector(reference):
    pair = Pair("c", "kvt", "kvt")
    try:
        expect_same(run_prompts(pair.proxy.url), reference, "c")
        moved = pair.bytes_written()
        assert moved == expected_kv_bytes(PROMPTS), (
            f"kvt wrote {moved} bytes of KV, expected "
            f"{expected_kv_bytes(PROMPTS)}")
        stats = pair.proxy.stats()
        firsts = [s["meta"]["first_block"] for s in stats]
        assert firsts == cached_blocks(PROMPTS, cluster.BLOCK_SIZE)
    finally:
        pair.stop()
