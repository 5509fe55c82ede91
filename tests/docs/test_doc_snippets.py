"""Every fenced code block of README.md and docs/*.md runs as written, or says why it does not.

A block's info string is ```LANGUAGE [TAGS]. What each language gets:

- ``python``: run in a fresh interpreter (repository root on PYTHONPATH, a scratch working
  directory holding a copy of examples/); it must exit 0. Tag ``launch`` runs it as the workers of
  ``reduction-server launch --workers 2 --reducers 1 -- python snippet.py`` (``launch=WxL``: W worker
  nodes of L processes), for snippets that need reducers and peers. Blocks that import torch are
  skipped when torch is not installed.
- ``bash`` / ``sh``: run with ``bash -e`` when tagged ``run`` or when every command is known to be
  safe (SAFE below: reads, local planning, exports).
- ``console``: ``$ command`` lines and their output. Run under the same rule as bash; each line
  of output shown must then appear in the command's output, in order (``...`` stands for any text;
  a line that is only ``...`` for any lines).
- ``json`` / ``yaml``: parsed.
- ``text`` (diagrams, formulas, log excerpts) and ``c++`` (header excerpts): nothing to run.

Anything else that is not run needs the tag ``no-run (REASON)`` with the reason in parentheses,
e.g. ```python no-run (needs a GPU)```. A block without a language fails: say what it is.
"""

from __future__ import annotations

import json
import os
import re
import shutil
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest
import yaml
from paths import ROOT

DOCS = [ROOT / "README.md"] + sorted((ROOT / "docs").glob("*.md"))
TIMEOUT = 180  # seconds per block (generous: the machine may be loaded)

RUN_LANGUAGES = {"python", "bash", "sh", "console"}
DATA_LANGUAGES = {"json", "yaml"}
INERT_LANGUAGES = {"text", "c++"}

# Commands that are run without a `run` tag: they only read, plan or print, or run a local job.
SAFE = [
    r"export [A-Z_][A-Z0-9_]*=\S+",
    r"reduction-server (--help|--version)",
    r"reduction-server (plan|vertex-job|job-token|launch) .*",
    r"reduction-server nccl-plugin(?!.*--install)( .*)?",
    r"python examples/vertex/submit\.py .*--dry-run.*",
]
FENCE = re.compile(r"^(\s*)```(.*)$")


@dataclass
class Block:
    path: Path
    line: int  # 1-based line of the opening fence
    language: str
    tags: str
    code: str

    @property
    def id(self) -> str:
        return f"{self.path.relative_to(ROOT)}:{self.line}"


def blocks_of(path: Path) -> list[Block]:
    out: list[Block] = []
    lines = path.read_text().splitlines()
    i = 0
    while i < len(lines):
        m = FENCE.match(lines[i])
        if not m:
            i += 1
            continue
        indent, info = len(m.group(1)), m.group(2).strip()
        start, body = i, []
        i += 1
        while i < len(lines) and not FENCE.match(lines[i]):
            body.append(lines[i][indent:] if lines[i][:indent].strip() == "" else lines[i])
            i += 1
        if i == len(lines):
            raise AssertionError(f"{path}:{start + 1}: the code block is never closed")
        language, _, tags = info.partition(" ")
        out.append(Block(path, start + 1, language.lower(), tags.strip(), "\n".join(body) + "\n"))
        i += 1
    return out


ALL_BLOCKS = [b for doc in DOCS for b in blocks_of(doc)]


def no_run_reason(block: Block) -> str | None:
    m = re.search(r"no-run\s*\(([^)]*)\)", block.tags)
    if m:
        return m.group(1).strip()
    if "no-run" in block.tags:
        return ""
    return None


# -- shell commands -------------------------------------------------------------------------------


def console_parts(code: str) -> tuple:
    """(commands, expected output lines) of a console block."""
    commands: list[str] = []
    expected: list[str] = []
    continuing = False
    for line in code.splitlines():
        if continuing:
            commands[-1] += "\n" + line
        elif line.startswith("$ "):
            commands.append(line[2:])
        elif line.strip():
            expected.append(line)
            continue
        continuing = line.rstrip().endswith("\\")
    return commands, expected


def shell_commands(code: str) -> list[str]:
    commands: list[str] = []
    continuing = False
    for line in code.splitlines():
        if continuing:
            commands[-1] += "\n" + line
        elif line.strip() and not line.lstrip().startswith("#"):
            commands.append(line.strip())
        continuing = line.rstrip().endswith("\\")
    return commands


def is_safe(command: str) -> bool:
    flat = re.sub(r"\s*#.*$", "", command.replace("\\\n", " "), flags=re.M)
    flat = " ".join(flat.split())
    if any(c in flat for c in (">", "<", "|", ";", "&&", "$(", "`")):
        return False
    return any(re.fullmatch(p, flat) for p in SAFE)


def _norm(line: str) -> str:
    return " ".join(line.split())


def output_matches(expected: list[str], actual: str) -> str | None:
    """None when every expected line appears in the actual output in order; else the first missing."""
    lines = [_norm(x) for x in actual.splitlines()]
    pos = 0
    for want in expected:
        w = _norm(want)
        if w == "..." or not w:
            continue
        pattern = re.compile(".*".join(re.escape(part) for part in w.split("...")) + r"\Z")
        while pos < len(lines) and not pattern.match(lines[pos]):
            pos += 1
        if pos == len(lines):
            return want
        pos += 1
    return None


# -- the scratch directory ------------------------------------------------------------------------


@pytest.fixture(scope="module")
def scratch(tmp_path_factory):
    """A working directory with a copy of examples/, and `python` / `reduction-server` on PATH
    meaning this interpreter and this tree."""
    d = tmp_path_factory.mktemp("snippets")
    shutil.copytree(ROOT / "examples", d / "examples")
    bindir = d / "bin"
    bindir.mkdir()
    for name, args in (("python", ""), ("python3", ""), ("reduction-server", " -m reducer.cli.main")):
        shim = bindir / name
        shim.write_text(f'#!/bin/sh\nexec "{sys.executable}"{args} "$@"\n')
        shim.chmod(0o755)
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("RS_", "CLUSTER_SPEC", "TF_CONFIG", "MASTER_", "LOCAL_RANK", "LOCAL_WORLD"))
    }
    env.update(
        PATH=f"{bindir}{os.pathsep}{env.get('PATH', '')}",
        PYTHONPATH=str(ROOT),
        OMP_NUM_THREADS="1",
        RS_CONNECT_TIMEOUT="60",
        RS_TIMEOUT="60",
    )
    return d, env


def _run(args: list[str], cwd: Path, env: dict) -> subprocess.CompletedProcess:
    try:
        return subprocess.run(args, cwd=cwd, env=env, capture_output=True, text=True, timeout=TIMEOUT)
    except subprocess.TimeoutExpired as e:
        pytest.fail(f"timed out after {TIMEOUT} s: {args}\n{e.stdout or ''}\n{e.stderr or ''}")


def _check(out: subprocess.CompletedProcess, block: Block) -> None:
    assert out.returncode == 0, (
        f"{block.id} exited {out.returncode}\n--- stdout\n{out.stdout[-4000:]}\n--- stderr\n{out.stderr[-4000:]}"
    )


def run_python(block: Block, scratch) -> None:
    d, env = scratch
    if re.search(r"^\s*(import|from) (torch|reducer\.torch)\b", block.code, re.M):
        pytest.importorskip("torch")
    script = d / f"snippet_{block.path.stem}_{block.line}.py"
    script.write_text(block.code)
    m = re.search(r"\blaunch(?:=(\d+)x(\d+))?", block.tags)
    if m:
        workers, procs = (int(m.group(1)), int(m.group(2))) if m.group(1) else (2, 1)
        args = [
            sys.executable,
            "-m",
            "reducer.cli.main",
            "launch",
            "--workers",
            str(workers),
            "--procs-per-worker",
            str(procs),
            "--reducers",
            "1",
            "--",
            "python",
            str(script),
        ]
    else:
        args = [sys.executable, str(script)]
    _check(_run(args, d, env), block)


def run_shell(block: Block, scratch) -> None:
    d, env = scratch
    if block.language == "console":
        commands, expected = console_parts(block.code)
    else:
        commands, expected = shell_commands(block.code), []
    assert commands, f"{block.id}: no command in the block"
    if "run" not in block.tags.split():
        unsafe = [c for c in commands if not is_safe(c)]
        assert not unsafe, (
            f"{block.id}: not known to be safe, so not run: {unsafe[0]!r}. Tag the block "
            "`run` (it is safe to run in a scratch directory) or `no-run (why)`."
        )
    out = _run(["bash", "-e", "-c", "\n".join(commands)], d, env)
    _check(out, block)
    missing = output_matches(expected, out.stdout + out.stderr)
    assert missing is None, (
        f"{block.id}: the documented output line {missing!r} is not in what the command "
        f"printed:\n{out.stdout[-4000:]}\n{out.stderr[-2000:]}"
    )


@pytest.mark.parametrize("block", ALL_BLOCKS, ids=[b.id for b in ALL_BLOCKS])
def test_doc_block(block: Block, scratch) -> None:
    reason = no_run_reason(block)
    if reason is not None:
        assert reason, f"{block.id}: `no-run` needs a reason in parentheses, e.g. no-run (needs a GPU)"
        pytest.skip(f"not run: {reason}")
    if block.language in INERT_LANGUAGES:
        return
    if block.language in DATA_LANGUAGES:
        (json.loads if block.language == "json" else yaml.safe_load)(block.code)
        return
    assert block.language in RUN_LANGUAGES, (
        f"{block.id}: a code block with language {block.language or '(none)'!r}: give it one of "
        f"{sorted(RUN_LANGUAGES | DATA_LANGUAGES | INERT_LANGUAGES)} or tag it `no-run (why)`"
    )
    if block.language == "python":
        run_python(block, scratch)
    else:
        run_shell(block, scratch)


# -- the rules themselves -------------------------------------------------------------------------


def test_the_rules_on_examples(tmp_path):
    doc = tmp_path / "x.md"
    doc.write_text(
        "text\n```python no-run (needs a GPU)\nimport cupy\n```\n"
        "  ```console\n  $ reduction-server plan --workers 2 \\\n      --worker-gbps 10\n"
        "  reducers needed: 1 x ...\n  ```\n"
    )
    a, b = blocks_of(doc)
    assert (a.language, no_run_reason(a), a.line) == ("python", "needs a GPU", 2)
    assert (b.language, b.line) == ("console", 5)
    commands, expected = console_parts(b.code)
    assert commands == ["reduction-server plan --workers 2 \\\n    --worker-gbps 10"]
    assert expected == ["reducers needed: 1 x ..."]
    assert is_safe(commands[0]) and is_safe("export RS_RANK=3          # global rank")
    assert not is_safe("reduction-server nccl-plugin --install /usr/lib --conf > /etc/nccl.conf")
    assert not is_safe("reduction-server plan --workers 2; rm -rf /")
    assert not is_safe("bash scripts/test.sh")
    assert output_matches(["a ... c", "...", "e"], "x\na b c\nd\ne\n") is None
    assert output_matches(["e", "a b c"], "a b c\ne\n") == "a b c"  # order matters
