"""The load line's time is the whole ``workbench.load()`` call, the import of the workbench's
own modules inside it included (they took 7-20 ms of a 20-30 ms warm start that said 0.011 s).

Clock-free in effect: the child process makes the first import of ``workbench.api`` (which
``workbench.load`` imports inside the call) take a second longer, through a real import hook,
and the line must count that second; a load of one cached family takes a small part of it."""

from __future__ import annotations

import re
import subprocess
import sys
import textwrap
from pathlib import Path

import workbench
from tests.reliability_helpers import child_env
from workbench import scaffold

DELAY_S = 1.0

CHILD = """
import sys, time
import workbench

class SlowImport:
    fired = False
    def find_spec(self, name, path=None, target=None):
        if name == "workbench.api" and not SlowImport.fired:
            SlowImport.fired = True
            time.sleep({delay})
        return None  # the ordinary finders import it

assert "workbench.api" not in sys.modules
sys.meta_path.insert(0, SlowImport())
workbench.load(sys.argv[1], namespace="wbloadtime", devices="cpu")
print("slowed:", SlowImport.fired)
"""


def test_the_load_line_counts_the_imports_inside_the_call(tmp_path: Path) -> None:
    kernels = tmp_path / "ops"
    scaffold.write_family(kernels, "timed", shift=2.0)
    workbench.load(kernels, namespace="wbloadtime", devices="cpu")  # built: the child's is cached
    code = textwrap.dedent(CHILD.format(delay=DELAY_S))
    proc = subprocess.run(
        [sys.executable, "-c", code, str(kernels)],
        capture_output=True,
        text=True,
        env=child_env(WB_QUIET="0"),
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr
    assert "slowed: True" in proc.stdout
    (line,) = [ln for ln in proc.stderr.splitlines() if "op families into torch.ops" in ln]
    assert "all cached" in line, line
    seconds = float(re.search(r", ([0-9.]+) s;", line).group(1))  # type: ignore[union-attr]
    assert seconds >= DELAY_S, line
