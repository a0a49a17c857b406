"""nvcc with its host pass and its device passes run side by side.

For ``nvcc -c x.cu`` nvcc runs its passes one after another: the host preprocessor and the
host front end (cudafe++); per target arch the device preprocessor, cicc and ptxas; then
fatbinary and the host compiler, which embeds the fat binary. The host front end and the device
passes share only the module id file, which cudafe++ writes and cicc reads. This script asks
nvcc for its plan (``--dryrun``), writes the module id file itself, runs the host front end
beside the device passes, and then fatbinary and the host compile: the same commands on the same
inputs, so the same object, in less wall time (the host front end leaves the critical path).

Output is replayed in nvcc's order, so diagnostics read exactly as nvcc's would, and a failing
pass ends the run with its exit code and nothing after it shown. Any command line or plan this
script does not recognise runs plain nvcc instead.

Usage: ``python nvcc_pipeline.py NVCC ARGS...`` (the workbench puts it before the nvcc command
of a kernel TU when a build has cores to spare; ``WB_NVCC_PIPELINE=0`` turns it off). Standard
library only: it starts in milliseconds.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

_ASSIGNMENT = re.compile(r"[A-Za-z_][A-Za-z0-9_]*=")
# Options that change what nvcc does beyond "compile one .cu to one object": left to nvcc.
_UNSUPPORTED = re.compile(
    r"-(-?dryrun|-?keep.*|-?save-temps|E|M|MM|MT|MP|MQ|M[FD]=.*|dc|dw|dlink|lib|link|run|cubin|"
    r"ptx|fatbin|optix-ir|ltoir|rdc.*|-relocatable-device-code.*|-device-c|-device-w|"
    r"-device-link|-generate-dependencies.*|-preprocess|-compile-as-tools-patch|Xnvlink.*|"
    r"-dependency-output.*|time|-time|-list-gpu.*|-version|V|h|-help|o=.*)"
)


@dataclass
class Step:
    kind: str  # host-pp, host-fe, device-pp, cicc, ptxas, fatbinary, host-cc
    command: str  # shell text, as nvcc printed it
    returncode: int | None = None
    started: float = 0.0  # time.monotonic() at its start and end
    ended: float = 0.0
    stdout: bytes = b""
    stderr: bytes = b""


@dataclass
class Plan:
    env: dict[str, str]  # the environment nvcc gives its passes
    steps: list[Step]  # in nvcc's order
    chains: list[list[Step]]  # runnable side by side; the first is the host front end
    tail: list[Step]  # after every chain: fatbinary, the host compile
    module_id: tuple[str, str] = ("", "")  # (file, id) written before the chains start
    depfiles: list[str] = field(default_factory=list)  # one per preprocessor pass
    depfile: tuple[str, str] | None = None  # (the -MF path, the target) nvcc would write


def _tokens(command: str) -> list[str]:
    try:
        return shlex.split(command)
    except ValueError:
        return []


def _kind(tokens: list[str]) -> str | None:
    if not tokens:
        return None
    tool = os.path.basename(tokens[0])
    if tool in ("cudafe++", "cicc", "ptxas", "fatbinary"):
        return "host-fe" if tool == "cudafe++" else tool
    if "-E" in tokens:
        return "device-pp" if any(t.startswith("-D__CUDA_ARCH__=") for t in tokens) else "host-pp"
    if "-c" in tokens:
        return "host-cc"
    return None


def _option(tokens: list[str], name: str) -> str | None:
    for i, t in enumerate(tokens[:-1]):
        if t == name:
            return tokens[i + 1]
    return None


def _split_depfile(args: Sequence[str]) -> tuple[list[str], str | None, str | None] | None:
    """nvcc's arguments without ``-MMD``/``-MD -MF PATH``, the -MF path and the mode flag."""
    rest: list[str] = []
    mode = path = None
    it = iter(args)
    for a in it:
        if a in ("-MMD", "-MD"):
            mode = a
        elif a == "-MF":
            path = next(it, None)
            if path is None:
                return None
        else:
            rest.append(a)
    if (mode is None) != (path is None):
        return None
    return rest, path, mode


def make_plan(nvcc: str, args: Sequence[str], tmp: str) -> Plan | None:
    """The plan of ``nvcc ARGS`` with intermediates under ``tmp``; None: run plain nvcc."""
    split = _split_depfile(args)
    if split is None:
        return None
    rest, mf, mode = split
    if "-c" not in rest or "-o" not in rest or any(_UNSUPPORTED.fullmatch(a) for a in rest):
        return None
    if sum(a.endswith(".cu") for a in rest) != 1:
        return None
    dry = subprocess.run(
        [nvcc, *rest, "--dryrun", "--keep", "--keep-dir", tmp],
        capture_output=True,
        text=True,
        check=False,
    )
    if dry.returncode != 0:
        return None
    env = dict(os.environ)
    steps: list[Step] = []
    for line in dry.stderr.splitlines():
        if not line.startswith("#$ "):
            return None
        text = line[3:].strip()
        if _ASSIGNMENT.match(text):  # NAME=value, the rest of the line (not shell syntax)
            name, _, value = text.partition("=")
            words = _tokens(value)
            env[name] = words[0] if len(words) == 1 else value.strip()
            continue
        kind = _kind(_tokens(text))
        if kind is None:
            return None
        steps.append(Step(kind, text))
    plan = Plan(env, steps, [], [])
    return plan if _arrange(plan, tmp, rest, mf, mode) else None


def _arrange(plan: Plan, tmp: str, args: list[str], mf: str | None, mode: str | None) -> bool:
    """Group the steps into chains; False when the plan is not the shape this script knows."""
    by_kind: dict[str, list[Step]] = {}
    for s in plan.steps:
        by_kind.setdefault(s.kind, []).append(s)
    one = ("host-pp", "host-fe", "fatbinary", "host-cc")
    if any(len(by_kind.get(k, [])) != 1 for k in one):
        return False
    pps, ciccs = by_kind.get("device-pp", []), by_kind.get("cicc", [])
    ptxases = by_kind.get("ptxas", [])
    if not pps or len(pps) != len(ciccs) or len(ptxases) > len(ciccs):
        return False
    host_pp, host_fe = by_kind["host-pp"][0], by_kind["host-fe"][0]
    # The module id: cudafe++ would write it; written here so cicc need not wait for cudafe++.
    fe = _tokens(host_fe.command)
    id_file = _option(fe, "--module_id_file_name")
    if id_file is None or "--gen_module_id_file" not in fe:
        return False
    host_fe.command = re.sub(r"\s--gen_module_id_file(?=\s)", "", host_fe.command)
    source = next(a for a in args if a.endswith(".cu"))
    stem = re.sub(r"\W", "_", os.path.basename(source))
    salt = hashlib.sha1(f"{os.path.abspath(source)}:{os.getpid()}:{tmp}".encode()).hexdigest()
    plan.module_id = (id_file, f"_{salt[:8]}_{len(stem)}_{stem}_{salt[8:16]}_{os.getpid()}")
    # One chain per arch: the device preprocessor's output feeds one cicc, whose PTX feeds ptxas.
    plan.chains = [[host_pp, host_fe]]
    unused_ptxas = list(ptxases)
    for pp in pps:
        ii = _option(_tokens(pp.command), "-o")
        cicc = next((c for c in ciccs if ii is not None and ii in _tokens(c.command)), None)
        if cicc is None:
            return False
        ciccs.remove(cicc)
        chain = [pp, cicc]
        ptx = _option(_tokens(cicc.command), "-o")
        ptxas = next(
            (p for p in unused_ptxas if ptx is not None and ptx in _tokens(p.command)), None
        )
        if ptxas is not None:
            unused_ptxas.remove(ptxas)
            chain.append(ptxas)
        plan.chains.append(chain)
    if unused_ptxas:
        return False
    plan.tail = [by_kind["fatbinary"][0], by_kind["host-cc"][0]]
    if mf is not None:  # each preprocessor pass lists what it read; their union is the depfile
        for i, pp in enumerate([host_pp, *pps]):
            path = os.path.join(tmp, f"pass{i}.d")
            pp.command += f" {mode} -MF {shlex.quote(path)}"
            plan.depfiles.append(path)
        plan.depfile = (mf, args[args.index("-o") + 1])
    return True


def _run_chain(env: dict[str, str], chain: list[Step]) -> None:
    for step in chain:
        step.started = time.monotonic()
        p = subprocess.run(
            ["bash", "-c", f"exec {step.command}"], env=env, capture_output=True, check=False
        )
        step.ended = time.monotonic()
        step.returncode, step.stdout, step.stderr = p.returncode, p.stdout, p.stderr
        if p.returncode != 0:
            return


def _read_deps(path: str) -> list[str]:
    with open(path) as f:
        text = f.read().replace("\\\n", " ")
    _, _, deps = text.partition(": ")
    return [d.replace("\\ ", " ") for d in re.findall(r"(?:\\ |[^\s])+", deps)]


def _write_depfile(plan: Plan) -> None:
    assert plan.depfile is not None
    path, target = plan.depfile
    seen: dict[str, None] = {}
    for d in plan.depfiles:
        for dep in _read_deps(d):
            seen.setdefault(dep, None)
    lines = [f"{target.replace(' ', chr(92) + ' ')} :"]
    lines += [f"    {dep.replace(' ', chr(92) + ' ')}" for dep in seen]
    with open(path, "w") as f:
        f.write(" \\\n".join(lines) + "\n")


def run(plan: Plan) -> int:
    """Run the plan; replay each pass's output in nvcc's order; nvcc's exit status."""
    id_file, module_id = plan.module_id
    with open(id_file, "w") as f:
        f.write(module_id)
    threads = [threading.Thread(target=_run_chain, args=(plan.env, c)) for c in plan.chains]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    if all(s.returncode == 0 for c in plan.chains for s in c):
        _run_chain(plan.env, plan.tail)
    for step in plan.steps:
        if step.returncode is None:  # not reached: an earlier pass in nvcc's order failed
            break
        sys.stdout.buffer.write(step.stdout)
        sys.stdout.flush()
        sys.stderr.buffer.write(step.stderr)
        sys.stderr.flush()
        if step.returncode != 0:
            return step.returncode
    if plan.depfile is not None:
        _write_depfile(plan)
    return 0


def main(argv: Sequence[str]) -> int:
    if len(argv) < 2:
        print("usage: nvcc_pipeline.py NVCC ARGS...", file=sys.stderr)
        return 2
    nvcc, args = argv[1], list(argv[2:])
    out = args[args.index("-o") + 1] if "-o" in args[:-1] else "."
    tmp = tempfile.mkdtemp(prefix=".nvcc-", dir=os.path.dirname(os.path.abspath(out)))
    try:
        plan = make_plan(nvcc, args, tmp)  # WB_NVCC_PIPELINE=0: ninja.launchers never calls it
        if plan is None:
            return subprocess.run([nvcc, *args], check=False).returncode
        return run(plan)
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
