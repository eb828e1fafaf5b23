# SPDX-License-Identifier: Apache-2.0
"""What README.md and docs/ promise a new user, tried as written.

Every fenced block of README.md and docs/*.md carries a language:

- python, c, sh: code. Each one runs as written (C is built against
  include/ and build/lib, then run; shell runs with bash from a copy of
  the tree whose `build` is the build being tested). A block preceded by
  `<!-- example: continues the block above -->` runs after the one
  before it, in the same interpreter. A block that cannot stand alone is
  preceded by `<!-- example: WHAT, checked by test_docs.py::TEST -->` and
  TEST checks it another way: Python fragments compile and their imports
  run, C fragments compile against the headers they name, shell
  fragments parse (`bash -n`) and name make targets that exist, a
  synopsis runs with small values of its own options.
- cmake: code with no runner here; it must be marked as above.
- text, json, kvt-auth-vector: output, tables, diagrams, layouts,
  samples. The synopses among them are the commands' own options, the
  JSON samples parse, and the paths the listings name exist.

A new block that is neither runnable nor marked fails this file.

Besides: every Python name the docs give (`kvt.X`, `TransferEngine.x`,
`KVManager.x`) exists; `kvt bench --help` states the defaults the
README's synopsis shows; `kvt info --help`, `kvt demo`'s model list and
docs/security.md's check behave as the docs say.
"""

import ast
import dataclasses
import importlib
import json
import os
import pathlib
import re
import shutil
import signal
import subprocess
import sys
from typing import Optional

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
KVT = os.environ.get("KVT_BIN", str(ROOT / "build" / "bin" / "kvt"))
BUILD = pathlib.Path(KVT).resolve().parents[1]
CC = shutil.which("gcc") or shutil.which("cc")

RUN_LANGS = {"python", "c", "sh"}
MARKED_LANGS = {"cmake"}  # code with no runner: a named test checks it
DATA_LANGS = {"text", "json", "kvt-auth-vector"}
CONTINUES = "continues the block above"


def blocks(path, lang):
    text = path.read_text()
    return re.findall(r"^```" + lang + r"\n(.*?)^```", text, re.M | re.S)


@dataclasses.dataclass
class Block:
    path: pathlib.Path
    line: int  # of the opening fence, from 1
    lang: str
    code: str
    marker: Optional[str]  # the text of <!-- example: ... --> before it

    @property
    def where(self):
        return f"{self.path.relative_to(ROOT)}:{self.line}"

    @property
    def checker(self):
        m = re.fullmatch(r".+, checked by test_docs\.py::(\w+)",
                         self.marker or "")
        return m.group(1) if m else None


def doc_blocks(path):
    lines = path.read_text().split("\n")
    out, i = [], 0
    while i < len(lines):
        m = re.fullmatch(r"( *)```([^`\s]*)\s*", lines[i])
        if not m:
            i += 1
            continue
        indent, lang = m.group(1), m.group(2)
        end = i + 1
        while end < len(lines) and lines[end].rstrip() != indent + "```":
            end += 1
        assert end < len(lines), f"{path.name}:{i + 1}: unclosed fence"
        code = "\n".join(ln[len(indent):] if ln.startswith(indent)
                         else ln.lstrip() for ln in lines[i + 1:end]) + "\n"
        mk = re.fullmatch(r"\s*<!-- example: (.+?) -->\s*",
                          lines[i - 1]) if i else None
        out.append(Block(path, i + 1, lang, code, mk and mk.group(1)))
        i = end + 1
    return out


ALL = [b for path in DOCS for b in doc_blocks(path)]


def marked(test_name):
    """The blocks whose marker names this test; at least one."""
    found = [b for b in ALL if b.checker == test_name]
    assert found, f"no block is marked as checked by {test_name}"
    return found


def runnable(lang):
    """Each unmarked block of the language, with the blocks that continue
    it appended: (where, code)."""
    progs = []
    for b in ALL:
        if b.lang != lang or b.checker:
            continue
        if b.marker == CONTINUES:
            progs[-1] = (progs[-1][0] + "+" + str(b.line),
                         progs[-1][1] + b.code)
        else:
            progs.append((b.where, b.code))
    return progs


def ids(progs):
    return [w for w, _ in progs]


# ---- every block labelled, and run or marked ----------------------------


def test_every_block_is_labelled_and_run_or_marked():
    problems = []
    previous = {}
    for b in ALL:
        known = RUN_LANGS | MARKED_LANGS | DATA_LANGS
        if not b.lang:
            problems.append(f"{b.where}: no language (text for output, "
                            "tables and diagrams)")
        elif b.lang not in known:
            problems.append(f"{b.where}: language {b.lang!r} is none of "
                            f"{sorted(known)}")
        if b.marker is not None:
            if b.marker == CONTINUES:
                prev = previous.get(b.path)
                if prev is None or prev.lang != b.lang or prev.checker:
                    problems.append(f"{b.where}: continues no runnable "
                                    f"{b.lang} block")
            elif b.checker is None:
                problems.append(f"{b.where}: marker {b.marker!r} is neither "
                                f"'{CONTINUES}' nor 'WHAT, checked by "
                                "test_docs.py::TEST'")
            elif not (b.checker.startswith("test_") and
                      callable(globals().get(b.checker))):
                problems.append(f"{b.where}: {b.checker} is not a test "
                                "of test_docs.py")
        elif b.lang in MARKED_LANGS:
            problems.append(f"{b.where}: {b.lang} has no runner here: mark "
                            "it with the test that checks it")
        previous[b.path] = b
    assert not problems, "\n".join(problems)
    assert runnable("python") and runnable("c") and runnable("sh")


# ---- the examples, run as written ---------------------------------------


@pytest.fixture(scope="module")
def tree(tmp_path_factory):
    """A copy of the tree made of links, whose build/ is the build being
    tested, and a bin/ with python3 (this interpreter) and kvt."""
    top = tmp_path_factory.mktemp("docs")
    work = top / "tree"
    work.mkdir()
    for entry in ROOT.iterdir():
        if entry.name not in ("build", ".git"):
            (work / entry.name).symlink_to(entry)
    (work / "build").symlink_to(BUILD)
    bindir = top / "bin"
    bindir.mkdir()
    (bindir / "python3").symlink_to(sys.executable)
    (bindir / "kvt").symlink_to(KVT)
    return work, bindir


def shell_env(bindir, **extra):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    env["PATH"] = f"{bindir}{os.pathsep}{env.get('PATH', '')}"
    env["KVT_LOG"] = "warn"
    env.update(extra)
    return env


@pytest.mark.parametrize("where,code", runnable("python"),
                         ids=ids(runnable("python")))
def test_python_example_runs(where, code, tree):
    out = subprocess.run([sys.executable, "-c", code], cwd=tree[0],
                         capture_output=True, text=True, timeout=60,
                         env=dict(os.environ, KVT_LOG="warn"))
    assert out.returncode == 0, (where, out.stdout, out.stderr)


def build_c(src, exe, *extra):
    assert CC, "no C compiler"
    return subprocess.run(
        [CC, "-std=c11", "-Wall", "-Wextra", "-Werror", *extra,
         f"-I{ROOT / 'include'}", str(src), "-o", str(exe),
         f"-L{BUILD / 'lib'}", "-lkvt", f"-Wl,-rpath,{BUILD / 'lib'}"],
        capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize("where,code", runnable("c"), ids=ids(runnable("c")))
def test_c_example_builds_and_runs(where, code, tmp_path):
    src = tmp_path / "example.c"
    src.write_text(code)
    built = build_c(src, tmp_path / "example")
    assert built.returncode == 0, (where, built.stderr)
    out = subprocess.run([str(tmp_path / "example")], capture_output=True,
                         text=True, timeout=60,
                         env=dict(os.environ, KVT_LOG="warn"))
    assert out.returncode == 0, (where, out.stdout, out.stderr)


@pytest.mark.parametrize("where,code", runnable("sh"), ids=ids(runnable("sh")))
def test_shell_example_runs(where, code, tree):
    out = subprocess.run(["bash", "-e", "-o", "pipefail", "-c", code],
                         cwd=tree[0], capture_output=True, text=True,
                         timeout=60, env=shell_env(tree[1]))
    assert out.returncode == 0, (where, out.stdout, out.stderr)


# ---- fragments ----------------------------------------------------------


def test_python_fragments_compile():
    """Each compiles, and its imports run: the names it takes exist."""
    for b in marked("test_python_fragments_compile"):
        assert b.lang == "python", b.where
        tree = ast.parse(b.code, b.where)
        imports = ast.Module(
            [n for n in tree.body if isinstance(n, (ast.Import,
                                                    ast.ImportFrom))], [])
        exec(compile(imports, b.where, "exec"), {})


def make_targets():
    text = (ROOT / "Makefile").read_text()
    return {t for m in re.finditer(r"^([\w .-]+?)\s*:(?!=)", text, re.M)
            for t in m.group(1).split()}


def test_shell_fragments_parse():
    """Each parses (bash -n); each make target it names is one of the
    Makefile's."""
    targets = make_targets()
    for b in marked("test_shell_fragments_parse"):
        assert b.lang == "sh", b.where
        out = subprocess.run(["bash", "-n"], input=b.code,
                             capture_output=True, text=True)
        assert out.returncode == 0, (b.where, out.stderr)
        for m in re.finditer(r"^\s*make((?: [a-z][\w-]*)*)", b.code, re.M):
            for target in m.group(1).split():
                assert target in targets, (b.where, target)


def test_c_declarations_are_the_headers():
    """Each declaration compiles after the header that has it (a prototype
    that differs is a conflicting-types error), and names a function the
    header declares."""
    headers = "".join(p.read_text() for p in
                      [*(ROOT / "include" / "kvt").glob("*.h"),
                       ROOT / "src" / "meta" / "meta.h"])
    for b in marked("test_c_declarations_are_the_headers"):
        assert b.lang == "c", b.where
        names = re.findall(r"\b(kvt_\w+)\s*\(", b.code)
        assert names, b.where
        for name in names:
            assert re.search(rf"\b{name}\s*\(", headers), (b.where, name)
        src = '#include <kvt/kvt.h>\n#include "meta/meta.h"\n' + b.code
        out = subprocess.run(
            [CC, "-std=gnu11", "-fsyntax-only", "-Werror", "-x", "c", "-",
             f"-I{ROOT / 'include'}", f"-I{ROOT / 'src'}"],
            input=src, capture_output=True, text=True, timeout=60)
        assert out.returncode == 0, (b.where, out.stderr)


def test_connector_step_fragment_compiles():
    """docs/connector.md's layer-wise loop, in a function whose arguments
    are the names it uses."""
    (b,) = marked("test_connector_step_fragment_compiles")
    src = ("#include <kvt/kvt.h>\n"
           "void forward_layer(uint32_t layer);\n"
           "void step(kvt_conn_h conn, kvt_sender_h sender,\n"
           "          const uint32_t *ids, size_t n, uint32_t layers)\n"
           "{\n" + b.code + "}\n")
    out = subprocess.run(
        [CC, "-std=c11", "-fsyntax-only", "-Wall", "-Wextra", "-Werror",
         "-x", "c", "-", f"-I{ROOT / 'include'}"],
        input=src, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, (b.where, out.stderr)


def c_tokens(code):
    code = re.sub(r"/\*.*?\*/|//[^\n]*", "", code, flags=re.S)
    return re.sub(r"\s+", "", code)


def test_tcp_table_is_the_sources():
    """docs/architecture.md's tcp table is tcp_iface.c's, comments and
    layout aside."""
    (b,) = marked("test_tcp_table_is_the_sources")
    src = (ROOT / "src" / "transport" / "tcp" / "tcp_iface.c").read_text()
    m = re.search(r"^KVT_TRANSPORT_REGISTER\(tcp,.*?^\}\);", src,
                  re.M | re.S)
    assert m, "tcp_iface.c has no KVT_TRANSPORT_REGISTER(tcp, ...)"
    assert c_tokens(b.code) == c_tokens(m.group(0)), (b.code, m.group(0))


def test_cmake_example_is_the_packaging_consumers():
    """Its lines, with `app` for the consumer's target, are those of the
    program packaging.install builds against a staged install."""
    consumer = (ROOT / "tests" / "packaging" / "consumer" /
                "CMakeLists.txt").read_text().splitlines()
    for b in marked("test_cmake_example_is_the_packaging_consumers"):
        for line in b.code.splitlines():
            assert line.replace("(app ", "(consumer ") in consumer, (
                b.where, line)


def readme_c_example():
    (where, code), = [p for p in runnable("c")
                      if p[0].startswith("README.md:")]
    return code


def test_pkg_config_builds_the_readme_c_example(tmp_path):
    """docs/packaging.md's command, as written, builds README.md's C
    example against an installed layout (the build's kvt.pc in
    PREFIX/lib/pkgconfig, headers and library linked in), and the
    program prints what README.md says it prints."""
    (b,) = marked("test_pkg_config_builds_the_readme_c_example")
    if not shutil.which("pkg-config"):
        pytest.skip("no pkg-config")
    prefix = tmp_path / "prefix"
    (prefix / "lib" / "pkgconfig").mkdir(parents=True)
    (prefix / "include").symlink_to(ROOT / "include")
    for lib in (BUILD / "lib").glob("libkvt.so*"):
        (prefix / "lib" / lib.name).symlink_to(lib)
    shutil.copy(BUILD / "kvt.pc", prefix / "lib" / "pkgconfig" / "kvt.pc")
    work = tmp_path / "work"
    work.mkdir()
    (work / "app.c").write_text(readme_c_example())
    env = dict(os.environ,
               PKG_CONFIG_PATH=str(prefix / "lib" / "pkgconfig"))
    out = subprocess.run(["bash", "-e", "-c", b.code], cwd=work, env=env,
                         capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, (b.where, out.stdout, out.stderr)
    run = subprocess.run(["./a.out"], cwd=work, capture_output=True,
                         text=True, timeout=60,
                         env=dict(os.environ, KVT_LOG="warn",
                                  LD_LIBRARY_PATH=str(prefix / "lib")))
    assert run.returncode == 0, (run.stdout, run.stderr)
    readme = " ".join((ROOT / "README.md").read_text().split())
    said = re.search(r"it prints `([^`]+)`", readme)
    assert said, "README.md no longer says what its C example prints"
    assert run.stdout.strip() == said.group(1)


# ---- synopses -----------------------------------------------------------


def synopses():
    """(where, command, text) of each block that is a kvt command's
    synopsis."""
    out = []
    for b in ALL:
        m = re.match(r"(?:build/bin/)?kvt ([a-z]+) ", b.code)
        if m and (b.lang == "text" or b.checker):
            out.append((b.where, m.group(1), b.code))
    return out


def test_synopses_are_the_commands_own():
    """Every option a synopsis shows, and every value it lists for one,
    is in the command's --help."""
    found = synopses()
    assert {c for _, c, _ in found} >= {"bench", "demo", "metad"}, found
    for where, command, text in found:
        help_text = subprocess.run([KVT, command, "--help"],
                                   capture_output=True, text=True)
        said = help_text.stdout + help_text.stderr
        for opt in re.findall(r"--[a-z][a-z-]*", text):
            assert re.search(re.escape(opt) + r"(?![\w-])", said), (where,
                                                                 opt)
        for alts in re.findall(r"--[a-z-]+[ =]([\w.-]+(?:\|[\w.-]+)+)",
                               text):
            for value in alts.split("|"):
                assert value in said, (where, value)


def readme_keys(after):
    """The JSON keys README.md's paragraph starting at `after` names."""
    text = (ROOT / "README.md").read_text()
    para = text[text.index(after):]
    para = para[:para.index("\n\n")]
    return {k for k in re.findall(r"`([a-z][a-z0-9_]*)`", para)
            if k != "null"}


def test_bench_synopsis_runs(tree):
    """README.md's kvt bench synopsis, run as shown with small values of
    its own options: the target prints its segment and serves until
    SIGINT; the initiator's JSON has every key README.md lists."""
    (b,) = marked("test_bench_synopsis_runs")
    cmds = [c for c in b.code.replace("\\\n", " ").splitlines()
            if c.startswith("build/bin/kvt")]
    target_cmd, initiator_cmd = cmds

    def args(cmd, **small):
        words = re.sub(r"\[[^]]*\]", "", cmd).split()
        for k, v in small.items():
            opt = "--" + k.replace("_", "-")
            assert f"[{opt}" in cmd, (opt, cmd)
            words.append(f"{opt}={v}" if v is not None else opt)
        return words

    env = shell_env(tree[1])
    target = subprocess.Popen(args(target_cmd, buffer_size="64M"),
                              cwd=tree[0], stdout=subprocess.PIPE, text=True,
                              env=env)
    try:
        line = target.stdout.readline()
        m = re.fullmatch(r"segment: (\S+:\d+)\n", line)
        assert m, line
        words = [w.replace("HOST:PORT", m.group(1)) for w in args(
            initiator_cmd, batch_size=16, duration=1, json=None)]
        out = subprocess.run(words, cwd=tree[0], capture_output=True,
                             text=True, timeout=60, env=env)
        assert out.returncode == 0, (words, out.stdout, out.stderr)
        result = json.loads(out.stdout.strip().splitlines()[-1])
        keys = readme_keys("with `--json` its last line is one object")
        assert keys and keys <= set(result), keys - set(result)
        assert result["errors"] == 0 and result["gbps"] > 0, result
        target.send_signal(signal.SIGINT)
        assert target.wait(timeout=30) == 0
    finally:
        if target.poll() is None:
            target.kill()
            target.wait()


def test_demo_synopsis_runs():
    """kvt demo with small values of the synopsis's options: the JSON
    line has every key README.md lists, and every byte was checked."""
    (where, _, text), = [s for s in synopses() if s[1] == "demo"]
    for opt in ("--requests", "--prompt-len", "--json"):
        assert opt in text, (where, opt)
    out = subprocess.run([KVT, "demo", "--requests", "2", "--prompt-len",
                          "16:32", "--json"], capture_output=True, text=True,
                         timeout=60, env=dict(os.environ, KVT_LOG="warn"))
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout.strip().splitlines()[-1])
    keys = readme_keys("With `--json` the last line is one JSON object")
    assert keys and keys <= set(result), keys - set(result)
    assert result["failed"] == 0 and result["requests"] == 2, result
    assert result["verified_bytes"] == result["bytes"] > 0, result
    # "protocol" is the transport that carried the bytes, not the option:
    # two processes on one host go over shm when left to choose.
    assert result["protocol_requested"] == "auto", result
    assert result["protocol"] == "shm", result
    out = subprocess.run([KVT, "demo", "--requests", "1", "--prompt-len",
                          "16:16", "--protocol", "tcp", "--json"],
                         capture_output=True, text=True, timeout=60)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert (result["protocol"], result["protocol_requested"]) == ("tcp",
                                                                  "tcp")


def test_python_overhead_synopsis_runs(tree):
    """docs/python.md's bench/python_overhead.py line, with small values
    of its options: it measures and prints its JSON line."""
    (b,) = marked("test_python_overhead_synopsis_runs")
    words = re.sub(r"\[[^]]*\]", "", b.code).split()
    assert words[1] == "bench/python_overhead.py", b.code
    for opt in ("--duration", "--rounds", "--json"):
        assert f"[{opt}" in b.code, opt
    out = subprocess.run(
        [sys.executable, *words[1:], "--duration=0.3", "--rounds=1",
         "--json", f"--kvt={KVT}"], cwd=tree[0], capture_output=True,
        text=True, timeout=60, env=dict(os.environ, KVT_LOG="warn"))
    assert out.returncode == 0, (out.stdout, out.stderr)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    assert result["sync_4k_ratio"] > 0 and result["batch_ratio"] > 0, result


# ---- data blocks ----------------------------------------------------------


def test_json_samples_parse():
    found = [b for b in ALL if b.lang == "json"]
    assert found
    for b in found:
        try:
            json.loads(b.code)
        except ValueError as e:
            pytest.fail(f"{b.where}: {e}")


def test_listed_paths_exist():
    """README.md's map of the tree (folders, and the docs it lists) and
    docs/python.md's listing of build/python."""
    (tree_block,) = [b for b in ALL if b.path.name == "README.md" and
                     b.code.startswith("include/kvt/")]
    folders = re.findall(r"^([\w./-]+/)\s", tree_block.code, re.M)
    assert len(folders) > 5, tree_block.code
    for folder in folders:
        assert (ROOT / folder).is_dir(), (tree_block.where, folder)
    docs = tree_block.code[tree_block.code.index("\ndocs/"):]
    for name in re.findall(r"[\w-]+\.md", docs):
        assert (ROOT / "docs" / name).is_file(), (tree_block.where, name)
    (listing,) = [b for b in ALL if b.path.name == "python.md" and
                  b.code.startswith("build/python/")]
    for line in listing.code.split():
        assert (BUILD / line[len("build/"):]).is_file(), (listing.where,
                                                          line)


# ---- names and commands ---------------------------------------------------


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
