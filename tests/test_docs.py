"""Every code block of README.md and docs/*.md runs, so the documentation cannot rot.

The two views that must agree: what a page shows and what the code does. Each page's ```python
blocks run in order in one namespace, in a temporary directory (with its own data root); the
```console / ```bash lines that start with `$ ` must be cheap `s5jax` commands (`--version`,
`--help`, `list`, `config`), which run in process and must exit 0. A block that needs a real
dataset or a long training run opts out with a comment line just before it that says why
(the pages are executed with JAX's standard dtype promotion, as a reader runs them):

    <!-- no-test: needs the LRA release and hours of training -->
"""

from __future__ import annotations

import re
import shlex
import sys
import types
from dataclasses import dataclass
from pathlib import Path

import jax
import pytest

from s5jax.cli import main

ROOT = Path(__file__).resolve().parent.parent
PAGES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
_OPEN = re.compile(r"^```(\w*)\s*$")
_MARKER = re.compile(r"^<!--\s*no-test(.*?)-->$")
_CHEAP = {"list", "config"}  # subcommands that neither train nor need a dataset


@dataclass
class Block:
    lang: str
    code: str
    line: int  # 1-based line of the opening fence
    skip: str | None  # the reason given by a no-test marker, or None


def _blocks(path: Path) -> list[Block]:
    lines = path.read_text(encoding="utf-8").splitlines()
    blocks, i = [], 0
    while i < len(lines):
        match = _OPEN.match(lines[i])
        if not match:
            i += 1
            continue
        end = next(j for j in range(i + 1, len(lines)) if lines[j].strip() == "```")
        marker = _MARKER.match(lines[i - 1].strip()) if i else None
        skip = marker.group(1).strip(" :-") if marker else None
        blocks.append(Block(match.group(1), "\n".join(lines[i + 1 : end]), i + 1, skip))
        i = end + 1
    return blocks


def _ids(paths):
    return [p.relative_to(ROOT).as_posix() for p in paths]


def test_pages_are_found():
    names = {p.name for p in PAGES}
    assert {"README.md", "index.md", "layer.md", "own-data.md"} <= names


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_every_marker_sits_before_a_block_and_says_why(page):
    lines = page.read_text(encoding="utf-8").splitlines()
    for n, line in enumerate(lines):
        marker = _MARKER.match(line.strip())
        if marker:
            assert marker.group(1).strip(" :-"), f"{page.name}:{n + 1}: say why it is not run"
            assert n + 1 < len(lines) and _OPEN.match(lines[n + 1]), (
                f"{page.name}:{n + 1}: a no-test marker must sit on the line before a ``` fence"
            )


def _commands(block: Block) -> list[str]:
    """The `$ ...` command lines of a console/bash block."""
    return [line[2:] for line in block.code.splitlines() if line.startswith("$ ")]


def _s5jax_args(command: str) -> list[str] | None:
    """The arguments of a cheap `s5jax` command line, or None when it is not one."""
    words = shlex.split(command, comments=True)
    if not words or words[0] != "s5jax":
        return None
    args = words[1:]
    if args in (["--version"], ["--help"]):
        return args
    rest = [a for a in args if a not in ("-q", "-v", "--quiet", "--verbose")]
    return args if rest and rest[0] in _CHEAP else None


@pytest.mark.parametrize("page", PAGES, ids=_ids(PAGES))
def test_code_blocks_run(page, tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("S5JAX_DATA", str(tmp_path / "data"))
    # A real module, so that classes defined on a page (dataclasses, eqx.Module) can find it.
    module = types.ModuleType("_docs_" + re.sub(r"\W", "_", page.stem))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    for block in _blocks(page):
        if block.skip is not None:
            continue
        where = f"{page.relative_to(ROOT)}:{block.line}"
        if block.lang == "python":
            # A reader's JAX promotes dtypes the standard way, not as strictly as conftest.py
            # sets it for our own code (optax's Adam mixes Python floats and int32 counts).
            with jax.numpy_dtype_promotion("standard"):
                exec(compile(block.code, where, "exec"), module.__dict__)
        elif block.lang in ("console", "bash", "sh", "shell"):
            for command in _commands(block):
                args = _s5jax_args(command)
                assert args is not None, (
                    f"{where}: `$ {command}` is not a cheap s5jax command (--version, --help, "
                    "list, config): mark the block <!-- no-test: why -->"
                )
                try:
                    status = main(args)
                except SystemExit as e:  # --help and --version exit through argparse
                    status = e.code
                assert status == 0, f"{where}: `$ {command}` exited {status}"
                capsys.readouterr()
