# SPDX-License-Identifier: Apache-2.0
"""What README.md and docs/ promise a new user, tried as written: the
README's Python example runs; every Python name the docs give (`kvt.X`,
`TransferEngine.x`, `KVManager.x`) exists; the command-line synopses the
README shows are the commands' own (`kvt bench --help` defaults, `kvt
info --help`)."""

import importlib
import os
import pathlib
import re
import subprocess
import sys

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
KVT = os.environ.get("KVT_BIN", str(ROOT / "build" / "bin" / "kvt"))


def blocks(path, lang):
    text = path.read_text()
    return re.findall(r"^```" + lang + r"\n(.*?)^```", text, re.M | re.S)


def test_readme_python_example_runs():
    found = blocks(ROOT / "README.md", "python")
    assert found, "README.md has no Python example"
    for code in found:
        out = subprocess.run([sys.executable, "-c", code],
                             capture_output=True, text=True, timeout=60,
                             env=dict(os.environ, KVT_LOG="warn"))
        assert out.returncode == 0, (code, out.stdout, out.stderr)


class Skip:
    """A name behind a framework this environment lacks."""

    def __init__(self, module):
        self.module = module

    def __repr__(self):
        return "needs " + str(self.module)


def resolve(dotted):
    """The object a dotted name names, importing the longest module
    prefix; None when it does not exist; a Skip for a name behind a
    framework this environment lacks."""
    parts = dotted.split(".")
    for cut in range(len(parts), 0, -1):
        try:
            obj = importlib.import_module(".".join(parts[:cut]))
        except ModuleNotFoundError as e:
            if e.name and not e.name.startswith("kvt"):
                return Skip(e.name)
            continue
        for p in parts[cut:]:
            try:
                obj = getattr(obj, p)
            except AttributeError:
                return None
            except ModuleNotFoundError as e:  # a lazy import of a framework
                return Skip(e.name)
        return obj
    return None


def promised_names():
    names = set()
    for path in DOCS:
        text = path.read_text()
        for m in re.finditer(r"`(kvt(?:\.[A-Za-z_][A-Za-z_0-9]*)+)", text):
            names.add((m.group(1), path.name))
        for m in re.finditer(r"`(TransferEngine|KVManager)\.([A-Za-z_]\w*)",
                             text):
            mod = "kvt" if m.group(1) == "TransferEngine" else "kvt.connector"
            names.add((f"{mod}.{m.group(1)}.{m.group(2)}", path.name))
    # A file name, not a Python name.
    return sorted(n for n in names if not n[0].endswith(".pc"))


def test_every_python_name_the_docs_give_exists():
    missing, skipped = [], []
    for name, where in promised_names():
        r = resolve(name)
        if isinstance(r, Skip):
            skipped.append((name, r))
        elif r is None:
            missing.append(f"{name} ({where})")
    assert not missing, "the docs name what does not exist: " + ", ".join(
        missing)
    print("checked", len(promised_names()), "names; skipped", skipped)


def test_bench_synopsis_is_the_commands_own():
    help_text = subprocess.run([KVT, "bench", "--help"], capture_output=True,
                               text=True, check=True).stdout
    shown = [b for b in blocks(ROOT / "README.md", "sh")
             if "kvt bench --mode=initiator" in b]
    assert shown, "README.md has no kvt bench synopsis"
    defaults = help_text[help_text.index("defaults:"):]
    # Every value the synopsis shows is a default the command states.
    for opt, val in re.findall(r"\[--([a-z-]+)=([0-9][0-9A-Za-z]*)\]",
                               shown[0]):
        assert f"--{opt}={val}" in defaults, (opt, val, defaults)


def test_info_help_is_usage():
    out = subprocess.run([KVT, "info", "--help"], capture_output=True,
                         text=True)
    assert out.returncode == 0 and out.stdout.startswith("usage: kvt info")
    out = subprocess.run([KVT, "info", "bogus"], capture_output=True,
                         text=True)
    assert out.returncode == 2 and "unknown argument" in out.stderr


def test_demo_unknown_model_lists_them():
    out = subprocess.run([KVT, "demo", "--model", "bogus"],
                         capture_output=True, text=True, timeout=60)
    assert out.returncode != 0
    assert "unknown model 'bogus'" in out.stderr
    for name in ("llama3-8b", "deepseek-v3"):
        assert name in out.stderr, out.stderr


def test_security_check_works_as_written():
    """docs/security.md's check: with KVT_LOG=info, the start-up line
    ends with "peers must prove the auth token"."""
    doc = (ROOT / "docs" / "security.md").read_text()
    step = doc[doc.index("4. Check:"):doc.index("5. To change")]
    assert "KVT_LOG=info" in step and "peers must prove the auth token" \
        in step
    code = ("import kvt; e = kvt.TransferEngine(); "
            "assert e.initialize('127.0.0.1', 'P2PHANDSHAKE', 'tcp', '') == 0")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True,
                         text=True, timeout=60,
                         env=dict(os.environ, KVT_LOG="info",
                                  KVT_PYTHON_LOGGING="0",
                                  KVT_AUTH_TOKEN="a-token-for-the-check"))
    assert out.returncode == 0, out.stderr
    assert "peers must prove the auth token" in out.stderr, out.stderr
