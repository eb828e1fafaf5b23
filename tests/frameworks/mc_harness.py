# SPDX-License-Identifier: Apache-2.0
"""Processes of test_mooncake_compat.py: mc_peer.py under kvt's drop-in
(`mooncake.engine` as installed in build/fw) or under Mooncake's own wheel
(build/fw/mooncake-real first on PYTHONPATH).

Peer.ev(expression) gives the value, or a Raised (the exception's type
name, its classes' names and message), or a Died (the process ended:
its exit status, negative for a signal). Every answer is waited for at
most `timeout` seconds, so no case can hang.
"""

import base64
import json
import os
import select
import signal
import socket
import subprocess
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

HERE = Path(__file__).resolve().parent
ROOT = HERE.parents[1]
FW = Path(os.environ.get("KVT_FW", ROOT / "build" / "fw"))
PYTHON = FW / "bin" / "python"
REAL_MOONCAKE = FW / "mooncake-real"
MODULES = ("kvt", "mooncake")
# Transfers fail after this many seconds; Mooncake raises anything lower
# to 5, so both run with 5.
TRANSFER_TIMEOUT_S = 5


@dataclass(frozen=True)
class Raised:
    type: str
    msg: str = field(default="", compare=False)
    mro: tuple = field(default=(), compare=False)

    def isa(self, name):
        return name in self.mro


@dataclass(frozen=True)
class Died:
    rc: int


def dec(v):
    if isinstance(v, list):
        return [dec(x) for x in v]
    if isinstance(v, dict):
        if "bytes" in v:
            return base64.b64decode(v["bytes"])
        if "notify" in v:
            return ("notify", *v["notify"])
        return {k: dec(x) for k, x in v.items()}
    return v


class Peer:
    def __init__(self, module, env=None):
        assert module in MODULES
        self.module = module
        penv = dict(os.environ)
        penv.pop("PYTHONPATH", None)
        penv.pop("KVT_TRANSFER_TIMEOUT", None)
        penv["MC_TRANSFER_TIMEOUT"] = str(TRANSFER_TIMEOUT_S)
        penv.setdefault("GLOG_minloglevel", "1")
        if module == "mooncake":
            penv["PYTHONPATH"] = str(REAL_MOONCAKE)
        penv.update(env or {})
        self.log = tempfile.TemporaryFile()
        self.proc = subprocess.Popen(
            [str(PYTHON), str(HERE / "mc_peer.py")], env=penv,
            stdin=subprocess.PIPE, stdout=subprocess.PIPE,
            stderr=self.log, text=True, cwd=str(HERE))
        hello = self._reply(30)
        assert not isinstance(hello, Died), self.stderr()
        path = hello["module"]
        if module == "mooncake":
            assert path.startswith(str(REAL_MOONCAKE)), path
        else:
            assert path.endswith("mooncake/engine.py"), path
            assert str(REAL_MOONCAKE) not in path, path

    @staticmethod
    def free_port():
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            return s.getsockname()[1]

    def _reply(self, timeout):
        ready, _, _ = select.select([self.proc.stdout], [], [], timeout)
        if not ready:
            self.proc.kill()
            raise TimeoutError(f"{self.module} peer: no answer in "
                               f"{timeout} s\n{self.stderr()}")
        line = self.proc.stdout.readline()
        if not line:
            return Died(self.proc.wait(10))
        return json.loads(line)

    def _send(self, cmd, timeout):
        if self.proc.poll() is not None:
            return Died(self.proc.returncode)
        try:
            self.proc.stdin.write(json.dumps(cmd) + "\n")
            self.proc.stdin.flush()
        except BrokenPipeError:
            return Died(self.proc.wait(10))
        out = self._reply(timeout)
        if isinstance(out, Died):
            return out
        if "raised" in out:
            return Raised(out["raised"], out["msg"], tuple(out["mro"]))
        return dec(out["ok"])

    def ev(self, expr, timeout=20):
        return self._send({"eval": expr}, timeout)

    def ex(self, code, timeout=20):
        out = self._send({"exec": code}, timeout)
        assert out is None, f"{self.module}: {code!r}: {out}"

    def init(self, host="127.0.0.1"):
        assert self.ev(f"e.initialize({host!r}, 'P2PHANDSHAKE', 'tcp', '')"
                       ) == 0, self.stderr()
        self.segment = f"127.0.0.1:{self.ev('e.get_rpc_port()')}"
        return self

    def kill(self):
        self.proc.send_signal(signal.SIGKILL)
        self.proc.wait(10)

    def stderr(self):
        self.log.seek(0)
        return self.log.read().decode(errors="replace")[-4000:]

    def close(self):
        if self.proc.poll() is None:
            self.proc.stdin.close()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(10)
        self.proc.stdout.close()
        self.log.close()
