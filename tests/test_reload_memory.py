"""Many edit-and-reload cycles keep the process bounded: at most two builds of a family stay
mapped (its first, which torch still points into, and the live one) and no file descriptor
leaks. Runs ``python -m bench reload_memory`` as a real process, with fewer cycles."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

from tests.reliability_helpers import PYTHON, ROOT, child_env

CYCLES = 12


def test_reloads_keep_the_first_and_the_live_library_mapped_and_no_fd_leaks(
    tmp_path: Path, cache_dir: Path
) -> None:
    out = tmp_path / "rows.json"
    proc = subprocess.run(
        [PYTHON, "-m", "bench", "reload_memory", "--cycles", str(CYCLES),
         "--every", "1", "--cache", str(cache_dir), "--json", str(out)],
        env=child_env(), cwd=ROOT, capture_output=True, text=True, timeout=1200,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stdout + proc.stderr
    rows = json.loads(out.read_text())
    assert [r["cycle"] for r in rows] == list(range(CYCLES + 1))
    assert rows[0]["family_libs"] == 1
    assert all(r["family_libs"] == 2 for r in rows[1:]), rows
    after_first = rows[1]
    assert all(r["fds"] == after_first["fds"] for r in rows[1:]), rows
    assert all(r["shared_objects"] == after_first["shared_objects"] for r in rows[1:]), rows
    assert "| cycle | rss_mib | family_libs |" in proc.stdout
