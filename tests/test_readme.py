"""The README's runnable code blocks run as written.

A block is runnable when the line right before its opening `````python`` fence
is ``<!-- runnable -->``. Such blocks must run on a machine without a GPU, a
CUDA driver, torch or CuPy. They may build on earlier runnable blocks: all of
them run in README order, in one namespace, in one fresh subprocess (so the
test process's imports and loaded libraries cannot help or hurt them). A
failure names the block's line in README.md and its first line, and the
traceback points at README.md line numbers.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
README = ROOT / "README.md"
MARKER = "<!-- runnable -->"

# Runs in the subprocess: argv[1] is a JSON list of [fence line, code]; the code is compiled with its README
# line numbers, so a traceback shows where in README.md it failed.
_RUNNER = r"""
import json, sys, traceback
blocks = json.loads(sys.argv[1])
ns = {"__name__": "__readme__"}
for i, (line, code) in enumerate(blocks, 1):
    first = next((s for s in code.splitlines() if s.strip()), "")
    try:
        exec(compile("\n" * line + code, "README.md", "exec"), ns)
    except BaseException:
        traceback.print_exc()
        print(f"README block {i} of {len(blocks)} (fence at README.md:{line}, first line {first!r}) failed",
              file=sys.stderr)
        sys.exit(1)
    print(f"block {i} ok (README.md:{line})", flush=True)
"""


def runnable_blocks(text: str) -> list[tuple[int, str]]:
    """``(line of the opening fence, code)`` for each ```` ```python```` block preceded by the marker line.

    Line numbers are 1-based. A marker not followed by a ```` ```python```` fence, or a block without a
    closing fence, raises ``ValueError`` (a marker that silently marks nothing would hide a block).
    """
    lines = text.splitlines()
    blocks = []
    i = 0
    while i < len(lines):
        if lines[i].strip() != MARKER:
            i += 1
            continue
        if i + 1 >= len(lines) or lines[i + 1].strip() != "```python":
            raise ValueError(f"README.md:{i + 1}: {MARKER} must be followed by a ```python fence")
        fence = i + 2  # 1-based line of the opening fence
        end = next((j for j in range(i + 2, len(lines)) if lines[j].strip() == "```"), None)
        if end is None:
            raise ValueError(f"README.md:{fence}: the runnable block has no closing fence")
        blocks.append((fence, "\n".join(lines[i + 2 : end]) + "\n"))
        i = end + 1
    return blocks


def test_runnable_blocks_parse():
    text = "intro\n<!-- runnable -->\n```python\nx = 1\n```\n```python\nnot marked\n```\n<!-- runnable -->\n```python\ny = x\n```\n"
    assert runnable_blocks(text) == [(3, "x = 1\n"), (10, "y = x\n")]
    with pytest.raises(ValueError, match="README.md:1: .* must be followed by a ```python fence"):
        runnable_blocks("<!-- runnable -->\n```bash\nls\n```\n")
    with pytest.raises(ValueError, match="no closing fence"):
        runnable_blocks("<!-- runnable -->\n```python\nx = 1\n")


def test_readme_runnable_blocks_run():
    blocks = runnable_blocks(README.read_text())
    assert blocks, f"no block of {README} is marked {MARKER}"
    r = subprocess.run(
        [sys.executable, "-c", _RUNNER, json.dumps(blocks)],
        capture_output=True,
        text=True,
        timeout=300,
        cwd=ROOT,
    )
    assert r.returncode == 0, f"{r.stderr}\n{r.stdout}"
    assert r.stdout.count(" ok (README.md:") == len(blocks), r.stdout
