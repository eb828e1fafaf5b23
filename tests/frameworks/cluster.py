# SPDX-License-Identifier: Apache-2.0
"""Processes of the framework tests: vLLM instances (plain, prefill,
decode; kvt's connector, vLLM's MooncakeConnector on kvt or on the real
Mooncake), the proxy (kvt.vllm.proxy) and kvt's bootstrap server (kvt
metad). Each runs in its own process group with its output in
build/fw/logs/, and every address is 127.0.0.1.

The instances serve the tiny model of make_model.py in float32, eager
(no compilation: a start takes ~25 s on 2 cores), with the same block
size, seed and batching everywhere, so that one plain instance is the
reference for every disaggregated pair.
"""

import json
import os
import signal
import socket
import subprocess
import time
import urllib.error
import urllib.request
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
FW = Path(os.environ.get("KVT_FW", ROOT / "build" / "fw"))
MODEL = FW / "model"
LOGS = FW / "logs"
PYTHON = FW / "bin" / "python"
REAL_MOONCAKE = FW / "mooncake-real"
REAL_NIXL = FW / "nixl-real"
HERE = Path(__file__).resolve().parent
KVT_BIN = Path(os.environ.get("KVT_BIN", ROOT / "build" / "bin" / "kvt"))

BLOCK_SIZE = 32
MAX_MODEL_LEN = 4096
START_TIMEOUT = 240.0


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def free_ports(n: int) -> int:
    """The first of n consecutive free ports (a metrics port per rank)."""
    for _ in range(100):
        base = free_port()
        socks = []
        try:
            for i in range(n):
                s = socket.socket()
                socks.append(s)
                s.bind(("127.0.0.1", base + i))
            return base
        except OSError:
            continue
        finally:
            for s in socks:
                s.close()
    raise RuntimeError(f"no {n} consecutive free ports")


def http(method, url, body=None, timeout=300.0):
    """(status, parsed JSON or text) of one request."""
    data = None if body is None else json.dumps(body).encode()
    req = urllib.request.Request(url, data=data, method=method,
                                 headers={"Content-Type":
                                          "application/json"})
    try:
        with urllib.request.urlopen(req, timeout=timeout) as r:
            status, text = r.status, r.read().decode()
    except urllib.error.HTTPError as e:
        status, text = e.code, e.read().decode()
    try:
        return status, json.loads(text)
    except ValueError:
        return status, text


class Proc:
    """A child process in its own group, output to LOGS/<name>.log."""

    def __init__(self, name, argv, env=None):
        LOGS.mkdir(parents=True, exist_ok=True)
        self.name = name
        self.log_path = LOGS / f"{name}.log"
        self.log = open(self.log_path, "ab")
        self.log.write(f"\n==== {time.ctime()}: {' '.join(map(str, argv))}"
                       "\n".encode())
        self.log.flush()
        full = dict(os.environ)
        full.update(env or {})
        self.p = subprocess.Popen([str(a) for a in argv], env=full,
                                  stdout=self.log, stderr=subprocess.STDOUT,
                                  start_new_session=True)

    def alive(self):
        return self.p.poll() is None

    def kill(self, sig=signal.SIGKILL):
        """Kill the whole group (vLLM's engine and worker processes too)."""
        try:
            os.killpg(self.p.pid, sig)
        except ProcessLookupError:
            pass

    def stop(self, grace=15.0):
        if self.alive():
            self.kill(signal.SIGTERM)
            try:
                self.p.wait(grace)
            except subprocess.TimeoutExpired:
                pass
        self.kill(signal.SIGKILL)
        try:
            self.p.wait(10)
        except subprocess.TimeoutExpired:
            pass
        self.log.close()

    def cpu_seconds(self):
        """User + system CPU time of every live process of the group."""
        total = 0
        for d in os.listdir("/proc"):
            if not d.isdigit():
                continue
            try:
                with open(f"/proc/{d}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if int(fields[2]) == self.p.pid:  # its process group
                total += int(fields[11]) + int(fields[12])
        return total / os.sysconf("SC_CLK_TCK")

    def errors(self, n=4):
        """The first @n lines logged at ERROR by this run of the process
        (traceback frames left out): what a failed request's caller is
        shown."""
        try:
            text = self.log_path.read_text(errors="replace")
        except OSError:
            return []
        run = text.rsplit("\n==== ", 1)[-1]
        out = []
        for line in run.splitlines():
            if " ERROR " not in line:
                continue
            msg = line.split("] ", 1)[-1]
            # A traceback's frames are indented.
            if not msg.strip() or msg[0].isspace() or msg.startswith(
                    "Traceback"):
                continue
            msg = msg.strip()
            out.append(f"{self.name}: {msg[:300]}")
            if len(out) == n:
                break
        return out

    def tail(self, n=40):
        try:
            lines = self.log_path.read_text(errors="replace").splitlines()
        except OSError:
            return ""
        return "\n".join(lines[-n:])


def wait_http(proc, url, timeout):
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if not proc.alive():
            raise RuntimeError(f"{proc.name} exited ({proc.p.returncode});"
                               f" its log ends:\n{proc.tail()}")
        try:
            with urllib.request.urlopen(url, timeout=2) as r:
                if r.status == 200:
                    return
        except (OSError, urllib.error.URLError):
            pass
        time.sleep(0.5)
    raise RuntimeError(f"{proc.name}: {url} not up within {timeout} s; "
                       f"its log ends:\n{proc.tail()}")


class Vllm:
    """One vLLM OpenAI server. kind: "plain", "kvt" (KvtConnector),
    "mooncake-kvt" (vLLM's MooncakeConnector on kvt's drop-in) or
    "mooncake-real" (the same on Mooncake's wheel). role: "prefill" or
    "decode" (ignored for plain)."""

    def __init__(self, name, kind="plain", role=None, tp=1, extra=None,
                 metrics_port=None, env=None, args=(), like=None,
                 alias=False, model=MODEL, restarts=0):
        """like: an instance (stopped) whose ports and engine id this one
        takes over, as a restarted server would (with the engine id
        suffixed by restarts, when given). alias: load kvt's
        connector as Mooncake's wheel names its own,
        mooncake.mooncake_connector_v1.MooncakeConnector."""
        self.alias = alias
        self.name, self.kind, self.role, self.tp = name, kind, role, tp
        self.port = like.port if like else free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.engine_id = (like.engine_id if like else
                          f"{name}-{self.port}") + (f"-{restarts}"
                                                    if restarts else "")
        # Mooncake's bootstrap server
        self.boot_port = like.boot_port if like else free_port()
        if like and metrics_port is None:
            metrics_port = like.metrics_port
        self.metrics_port = metrics_port
        e = {"VLLM_HOST_IP": "127.0.0.1", "VLLM_CPU_KVCACHE_SPACE": "1",
             "VLLM_MOONCAKE_BOOTSTRAP_PORT": str(self.boot_port),
             "VLLM_CONFIGURE_LOGGING": "1", "PYTHONUNBUFFERED": "1",
             "TOKENIZERS_PARALLELISM": "false", "HF_HUB_OFFLINE": "1",
             "KVT_LOG": "info", "VLLM_CPU_OMP_THREADS_BIND": "nobind",
             "OMP_NUM_THREADS": "1", "KMP_BLOCKTIME": "0"}
        path = [str(HERE)]
        if kind == "mooncake-real":
            path.insert(0, str(REAL_MOONCAKE))
        if kind == "nixl-real":
            # NIXL's wheel, its progress thread sleeping
            # (nixl_ref/sitecustomize.py says why).
            path[:0] = [str(HERE / "nixl_ref"), str(REAL_NIXL)]
        if kind.startswith("nixl"):
            # vLLM's NixlConnector handshakes over its own side channel.
            self.side_port = like.side_port if like else free_port()
            e["VLLM_NIXL_SIDE_CHANNEL_PORT"] = str(self.side_port)
            e["VLLM_NIXL_SIDE_CHANNEL_HOST"] = "127.0.0.1"
            e["KVT_NIXL_HOST"] = "127.0.0.1"
        e["PYTHONPATH"] = os.pathsep.join(path)
        if metrics_port and kind != "kvt":
            e["KVT_METRICS_PORT"] = str(metrics_port)
        e.update(env or {})
        argv = [PYTHON, "-m", "vllm.entrypoints.openai.api_server",
                "--model", model, "--served-model-name", "tiny",
                "--dtype", "float32", "--max-model-len", MAX_MODEL_LEN,
                "--block-size", BLOCK_SIZE, "--enforce-eager",
                "--seed", "0", "--host", "127.0.0.1", "--port", self.port,
                "--tensor-parallel-size", tp,
                "--disable-uvicorn-access-log"]
        if kind != "plain":
            argv += ["--kv-transfer-config",
                     json.dumps(self._kv_config(extra or {}))]
        argv += list(args)
        self.proc = Proc(name, argv, e)

    def _kv_config(self, extra):
        role = "kv_producer" if self.role == "prefill" else "kv_consumer"
        if self.kind.startswith("nixl"):
            # vLLM's NixlConnector: on kvt's nixl package (installed in
            # build/fw) or on NIXL's wheel (build/fw/nixl-real first on
            # the path). The KV cache is host memory on the CPU build.
            return {"kv_connector": "NixlConnector", "kv_role": "kv_both",
                    "kv_buffer_device": "cpu", "engine_id": self.engine_id,
                    "kv_connector_extra_config": dict(extra)}
        if self.kind == "kvt" and self.alias:
            cfg = {"kv_connector": "MooncakeConnector",
                   "kv_connector_module_path":
                   "mooncake.mooncake_connector_v1"}
        elif self.kind == "kvt":
            cfg = {"kv_connector": "KvtConnector",
                   "kv_connector_module_path": "kvt.vllm"}
        if self.kind == "kvt":
            extra = dict(extra)
            if self.metrics_port:
                extra["metrics_port"] = self.metrics_port
        else:
            # vLLM's own MooncakeConnector, through the one-line CPU
            # adapter (vllm_cpu.py says why).
            cfg = {"kv_connector": "MooncakeConnector",
                   "kv_connector_module_path": "vllm_cpu"}
            extra = dict(extra, mooncake_protocol="tcp")
        cfg.update(kv_role=role, engine_id=self.engine_id,
                   kv_connector_extra_config=extra)
        return cfg

    def wait(self, timeout=START_TIMEOUT):
        wait_http(self.proc, self.url + "/v1/models", timeout)
        return self

    def stop(self):
        self.proc.stop()


class Proxy:
    def __init__(self, name, prefill, decode, flow, timeout=120.0):
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        argv = [PYTHON, "-m", "kvt.vllm.proxy", "--port", self.port,
                "--flow", flow, "--prefill", prefill.url,
                "--decode", decode.url, "--timeout", timeout]
        if flow == "mooncake":
            argv += ["--prefill-engine-id", prefill.engine_id,
                     "--prefill-bootstrap",
                     f"http://127.0.0.1:{prefill.boot_port}"]
        self.proc = Proc(name, argv, {"PYTHONUNBUFFERED": "1"})
        wait_http(self.proc, self.url + "/health", 60)

    def stats(self):
        return http("GET", self.url + "/stats")[1]

    def stop(self):
        self.proc.stop()


class Metad:
    """kvt's bootstrap server."""

    def __init__(self, name="metad"):
        self.port = free_port()
        self.addr = f"127.0.0.1:{self.port}"
        self.proc = Proc(name, [KVT_BIN, "metad", "--port", self.port])
        wait_http(self.proc, f"http://{self.addr}/health", 30)

    def stop(self):
        self.proc.stop()


def complete(url, prompt, max_tokens=32, timeout=300.0, **extra):
    """Greedy completion of a token-id prompt: (status, token ids or the
    error body)."""
    body = {"model": "tiny", "prompt": prompt, "max_tokens": max_tokens,
            "temperature": 0, "ignore_eos": True, "return_token_ids": True}
    body.update(extra)
    status, out = http("POST", url + "/v1/completions", body, timeout)
    if status != 200:
        return status, out
    return status, out["choices"][0]["token_ids"]


def metric(port, name, **labels):
    """The sum of a Prometheus counter's samples whose labels include
    these, from kvt's /metrics on port."""
    status, text = http("GET", f"http://127.0.0.1:{port}/metrics")
    assert status == 200, text
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(name):
            continue
        head, _, value = line.rpartition(" ")
        if head != name and not head.startswith(name + "{"):
            continue
        if all(f'{k}="{v}"' in head for k, v in labels.items()):
            total += float(value)
    return total

