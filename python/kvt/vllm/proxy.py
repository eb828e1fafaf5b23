# SPDX-License-Identifier: Apache-2.0
"""A minimal prefill/decode proxy for vLLM's OpenAI completions API.

    python -m kvt.vllm.proxy --port 8000 --flow kvt \\
        --prefill http://127.0.0.1:8100 --decode http://127.0.0.1:8200

Three flows:

- ``mooncake`` (vLLM's MooncakeConnector, on Mooncake or on kvt's
  drop-in): the request goes to prefill with ``max_tokens`` 1 and
  ``{"do_remote_decode": true, "transfer_id": T}``; once prefill answers,
  to decode with ``{"do_remote_prefill": true, "transfer_id": T,
  "remote_engine_id": ..., "remote_bootstrap_addr": ...}`` (the prefill
  instance's engine id and Mooncake bootstrap server, given here).
- ``nixl`` (vLLM's NixlConnector, on NIXL or on kvt's ``nixl``): the
  request goes to prefill with ``max_tokens`` 1 and
  ``{"do_remote_decode": true}``; prefill's answer carries the
  ``kv_transfer_params`` (its engine id, block ids, side channel) that
  go with the request to decode, which reads the blocks.
- ``kvt`` (kvt.vllm.KvtConnector, layer-wise): the request goes to decode
  first with ``{"do_remote_prefill": true, "transfer_id": T,
  "metaserver": URL}``; decode's worker posts its room to URL (this
  proxy's ``/meta``) once its blocks are allocated, and only then does the
  proxy start the request on prefill, which pushes each layer as it
  computes it. Decode answers once every layer has landed.

Either way the client gets decode's answer. An error on either side (a
refused or failed request, a prefill instance that is down, decode
reporting a failed transfer as finish_reason "error", no answer within
``--timeout``) ends the request with HTTP 502 and a JSON error naming
the side and the cause; when prefill fails in the ``kvt`` flow the
decode request is cancelled (vLLM aborts it and its receiver).

``GET /stats`` returns the timings of the last requests (seconds from
arrival): ``prefill_sent`` (prefill started), ``prefill_done``,
``decode_done``; ``GET /health`` answers 200.
"""

import argparse
import asyncio
import collections
import json
import logging
import time
import uuid

from aiohttp import ClientSession, ClientTimeout, TCPConnector, web

log = logging.getLogger("kvt.vllm.proxy")


class ProxyError(Exception):
    def __init__(self, side, cause):
        super().__init__(f"{side}: {cause}")
        self.side = side
        self.cause = cause


class Proxy:
    def __init__(self, args):
        self.args = args
        self.prefill = args.prefill.rstrip("/")
        self.decode = args.decode.rstrip("/")
        self.timeout = args.timeout
        self.ready: dict[str, asyncio.Future] = {}
        self.stats = collections.deque(maxlen=4096)
        self.session: ClientSession = None
        self.rr = 0

    async def start(self, app):
        # A connection per request: a kept-alive one that the server has
        # just closed fails the request sent on it, and a request cannot
        # safely be sent twice (it would start a second transfer).
        self.session = ClientSession(
            timeout=ClientTimeout(total=self.timeout),
            connector=TCPConnector(force_close=True))

    async def stop(self, app):
        await self.session.close()

    async def _post(self, side, url, body):
        """POST a completions request; the parsed answer, or ProxyError."""
        try:
            async with self.session.post(url, json=body) as resp:
                text = await resp.text()
                if resp.status != 200:
                    raise ProxyError(side, f"HTTP {resp.status}: "
                                     f"{text[:500]}")
                out = json.loads(text)
        except ProxyError:
            raise
        except asyncio.TimeoutError:
            raise ProxyError(side, f"no answer within {self.timeout} s")
        except Exception as e:  # noqa: BLE001 (connection errors and more)
            raise ProxyError(side, f"{type(e).__name__}: {e}")
        for choice in out.get("choices", ()):
            if choice.get("finish_reason") == "error":
                raise ProxyError(side, "the request failed (finish_reason "
                                 "error; its KV transfer failed?)")
        return out

    @staticmethod
    def _prefill_body(body, tid):
        p = dict(body)
        p.update(max_tokens=1, stream=False)
        p.pop("max_completion_tokens", None)
        p["kv_transfer_params"] = {"do_remote_decode": True,
                                   "transfer_id": tid}
        return p

    async def completions(self, request):
        body = await request.json()
        if body.get("stream"):
            return web.json_response(
                {"error": "streaming is not supported by this proxy"},
                status=400)
        tid = body.pop("transfer_id", None) or f"kvt-{uuid.uuid4().hex}"
        st = {"transfer_id": tid, "t0": time.monotonic()}
        try:
            if self.args.flow == "mooncake":
                out = await self._mooncake(body, tid, st)
            elif self.args.flow == "nixl":
                out = await self._nixl(body, tid, st)
            else:
                out = await self._layerwise(body, tid, st)
        except ProxyError as e:
            st["error"] = str(e)
            self._record(st)
            log.warning("transfer %s: %s", tid, e)
            return web.json_response(
                {"error": {"side": e.side, "message": e.cause,
                           "transfer_id": tid}}, status=502)
        self._record(st)
        return web.json_response(out)

    def _record(self, st):
        t0 = st.pop("t0")
        for k in ("prefill_sent", "prefill_done", "decode_done"):
            if k in st:
                st[k] = st[k] - t0
        self.stats.append(st)

    async def _mooncake(self, body, tid, st):
        st["prefill_sent"] = time.monotonic()
        await self._post("prefill", self.prefill + "/v1/completions",
                         self._prefill_body(body, tid))
        st["prefill_done"] = time.monotonic()
        d = dict(body)
        d["kv_transfer_params"] = {
            "do_remote_prefill": True, "transfer_id": tid,
            "remote_engine_id": self.args.prefill_engine_id,
            "remote_bootstrap_addr": self.args.prefill_bootstrap}
        out = await self._post("decode", self.decode + "/v1/completions", d)
        st["decode_done"] = time.monotonic()
        return out

    async def _nixl(self, body, tid, st):
        st["prefill_sent"] = time.monotonic()
        p = self._prefill_body(body, tid)
        p["kv_transfer_params"] = {"do_remote_decode": True,
                                   "do_remote_prefill": False,
                                   "remote_engine_id": None,
                                   "remote_block_ids": None,
                                   "remote_host": None,
                                   "remote_port": None}
        pre = await self._post("prefill", self.prefill + "/v1/completions",
                               p)
        st["prefill_done"] = time.monotonic()
        params = pre.get("kv_transfer_params")
        if not params:
            raise ProxyError("prefill", "no kv_transfer_params in its answer "
                             "(is it running vLLM's NixlConnector?)")
        d = dict(body)
        d["kv_transfer_params"] = params
        out = await self._post("decode", self.decode + "/v1/completions", d)
        st["decode_done"] = time.monotonic()
        return out

    async def _layerwise(self, body, tid, st):
        ready = self.ready[tid] = asyncio.get_running_loop().create_future()
        d = dict(body)
        d["kv_transfer_params"] = {"do_remote_prefill": True,
                                   "transfer_id": tid,
                                   "metaserver": self.args.metaserver}
        decode = asyncio.create_task(
            self._post("decode", self.decode + "/v1/completions", d))
        try:
            done, _ = await asyncio.wait({decode, ready},
                                         timeout=self.timeout,
                                         return_when=asyncio.FIRST_COMPLETED)
            if decode in done:
                decode.result()  # raises the decode side's error
                raise ProxyError("decode", "answered before its transfer "
                                 "started")
            if not done:
                raise ProxyError("decode", "its worker did not post its "
                                 f"room within {self.timeout} s")
            st["meta"] = ready.result()
            st["prefill_sent"] = time.monotonic()
            await self._post("prefill", self.prefill + "/v1/completions",
                             self._prefill_body(body, tid))
            st["prefill_done"] = time.monotonic()
            out = await decode
            st["decode_done"] = time.monotonic()
            return out
        finally:
            self.ready.pop(tid, None)
            if not decode.done():
                # Closing the connection aborts the request in vLLM, and
                # the connector aborts its receiver.
                decode.cancel()
                try:
                    await decode
                except (asyncio.CancelledError, ProxyError):
                    pass

    async def meta(self, request):
        """Decode's worker: its room is open, blocks announced."""
        body = await request.json()
        fut = self.ready.get(body.get("transfer_id"))
        if fut is None:
            return web.json_response({"error": "unknown transfer_id"},
                                     status=404)
        if not fut.done():
            fut.set_result(body)
        return web.json_response({"ok": True})

    async def get_stats(self, request):
        return web.json_response(list(self.stats))

    async def health(self, request):
        return web.json_response({"ok": True})


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--host", default="127.0.0.1")
    ap.add_argument("--port", type=int, default=8000)
    ap.add_argument("--prefill", required=True, help="prefill base URL")
    ap.add_argument("--decode", required=True, help="decode base URL")
    ap.add_argument("--flow", choices=("mooncake", "nixl", "kvt"), default="kvt")
    ap.add_argument("--prefill-engine-id",
                    help="mooncake flow: prefill's kv_transfer_config "
                    "engine_id")
    ap.add_argument("--prefill-bootstrap",
                    help="mooncake flow: prefill's Mooncake bootstrap "
                    "server, http://HOST:PORT")
    ap.add_argument("--metaserver",
                    help="kvt flow: the URL decode posts to (default: "
                    "this proxy's /meta)")
    ap.add_argument("--timeout", type=float, default=120.0,
                    help="seconds a request may take on each side")
    args = ap.parse_args(argv)
    if args.flow == "mooncake" and not (args.prefill_engine_id
                                        and args.prefill_bootstrap):
        ap.error("the mooncake flow needs --prefill-engine-id and "
                 "--prefill-bootstrap")
    if not args.metaserver:
        args.metaserver = f"http://{args.host}:{args.port}/meta"
    logging.basicConfig(level=logging.INFO,
                        format="%(asctime)s proxy %(levelname)s %(message)s")
    proxy = Proxy(args)
    app = web.Application(client_max_size=64 << 20)
    app.on_startup.append(proxy.start)
    app.on_cleanup.append(proxy.stop)
    app.router.add_post("/v1/completions", proxy.completions)
    app.router.add_post("/meta", proxy.meta)
    app.router.add_get("/stats", proxy.get_stats)
    app.router.add_get("/health", proxy.health)
    web.run_app(app, host=args.host, port=args.port, print=None)


if __name__ == "__main__":
    main()
