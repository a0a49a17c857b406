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

With ``--reuse-host DIR`` the host compile is kept apart from the device code: the fat binary's
bytes go into an object of their own (the same bytes, in the same section, under a hidden name
that the host side refers to), so the host compile's inputs are exactly nvcc's host-side output
(the host front end's translation and its stub). When an edit leaves those unchanged, as a
kernel-body edit that moves no line does, the host object compiled for them before is taken from
DIR (with the diagnostics it printed) instead of compiling the host side again, and the two
objects are merged into the one ``-o`` names (``-r``). The module id is then derived from the
source path and the arguments, not from the process, so that an unchanged host side reads the
same at every build. For a translation unit that includes torch's headers the host compile is the
longest pass; the device passes run as before.

``--times FILE`` writes each pass's seconds as JSON (what ``wb why`` reports for a drop-in TU).

Usage: ``python nvcc_pipeline.py [--reuse-host DIR] [--times FILE] NVCC ARGS...`` (the workbench
puts it before the nvcc command of a kernel TU when a build has cores to spare, and before a
drop-in ``.cu`` with ``--reuse-host``; ``WB_NVCC_PIPELINE=0`` turns it off). Standard library
only: it starts in milliseconds.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
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
    reuse: Reuse | None = None  # --reuse-host: the host object's cache, and what it did


@dataclass
class Reuse:
    folder: str  # host objects of one source, by the key of their inputs
    key: str = ""
    hit: bool = False


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


def make_plan(
    nvcc: str, args: Sequence[str], tmp: str, reuse_host: str | None = None
) -> Plan | None:
    """The plan of ``nvcc ARGS`` with intermediates under ``tmp``; None: run plain nvcc.

    ``reuse_host``: the folder of host objects to reuse (see the module's docstring)."""
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
    if reuse_host is not None:
        source = next(a for a in rest if a.endswith(".cu"))
        plan.reuse = Reuse(os.path.join(reuse_host, _digest([os.path.abspath(source)])[:16]))
    return plan if _arrange(plan, tmp, rest, mf, mode) else None


def _digest(parts: Sequence[str | bytes]) -> str:
    h = hashlib.sha256()
    for part in parts:
        data = part.encode() if isinstance(part, str) else part
        h.update(len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


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
    if plan.reuse is not None:  # the same at every build of this source with these arguments
        out = args.index("-o") + 1
        salt = _digest([os.path.abspath(source), *args[:out], *args[out + 1 :]])
    else:
        salt = hashlib.sha1(f"{os.path.abspath(source)}:{os.getpid()}:{tmp}".encode()).hexdigest()
    tail = salt[16:24] if plan.reuse is not None else str(os.getpid())
    plan.module_id = (id_file, f"_{salt[:8]}_{len(stem)}_{stem}_{salt[8:16]}_{tail}")
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


def run(plan: Plan, tmp: str = "") -> int:
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
        if plan.reuse is not None and tmp:
            _run_tail_reusing_host(plan, tmp)
        else:
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


# nvcc's embedded fat binary: its bytes as assembler data under a local label, then C that
# declares the label with the array's length and points the registration wrapper at it.
_DATA = re.compile(
    r'^asm\(\n(".section \.nv_fatbin, .*?\n)"fatbinData:\\n"\n(.*?)\);\n', re.S | re.M
)
_DECL = re.compile(r"^extern const unsigned long long fatbinData\[\d+\];$", re.M)


def _split_fatbin(path: str, name: str) -> str | None:
    """Rewrite nvcc's ``x.fatbin.c`` at ``path`` so that it only refers to the bytes, under the
    hidden symbol ``name``; return the C text that defines them. None: not the layout known."""
    with open(path) as f:
        text = f.read()
    data, decl = _DATA.search(text), _DECL.search(text)
    if data is None or decl is None or text.count("fatbinData") != 3:
        return None
    label = f'".globl {name}\\n.hidden {name}\\n{name}:\\n"\n'
    bytes_c = f"asm(\n{data.group(1)}{label}{data.group(2)});\n"
    host = text[: data.start()] + text[data.end() :]
    host = _DECL.sub(
        f'extern const unsigned long long fatbinData[] __asm__("{name}") '
        '__attribute__((visibility("hidden")));',
        host,
    )
    with open(path, "w") as f:
        f.write(host)
    return bytes_c


# A device function's body, which the host front end keeps for reference between ``#if 0`` and
# ``#endif``: a line marker (``# N``) next sets the line number, so the host compiler's input
# does not depend on what the block holds.
_MARKER = re.compile(rb"# \d+(?: |$)")


def host_text(data: bytes) -> bytes:
    """The host front end's output as the host compiler sees it: each ``#if 0`` block that holds
    only code and line markers and that a line marker follows left out; any other block kept."""
    lines = data.split(b"\n")
    out: list[bytes] = []
    i = 0
    while i < len(lines):
        if lines[i] == b"#if 0":
            end = i + 1
            while end < len(lines) and lines[end] != b"#endif":
                end += 1
            body = lines[i + 1 : end]
            plain = all(not ln.startswith(b"#") or _MARKER.match(ln) for ln in body)
            if end + 1 < len(lines) and plain and _MARKER.match(lines[end + 1]):
                out += [b"#if 0", b"#endif"]
                i = end + 1
                continue
        out.append(lines[i])
        i += 1
    return b"\n".join(out)


def _host_key(host_cc: Step, tmp: str, fatbin_c: str) -> str:
    """The host compile's inputs: its command (output aside), nvcc's host-side files and the
    compiler's file identity; the temporary folder's name is left out."""
    tokens = _tokens(host_cc.command)
    out = tokens.index("-o")
    compiler = shutil.which(tokens[0]) or tokens[0]
    st = os.stat(compiler)
    source = next(t for t in tokens if t.endswith(".cudafe1.cpp"))
    stub = source.removesuffix(".cudafe1.cpp") + ".cudafe1.stub.c"
    parts: list[str | bytes] = [*tokens[:out], *tokens[out + 2 :], f"{compiler}:{st.st_size}"]
    parts.append(str(st.st_mtime_ns))
    for file in (source, stub, fatbin_c):
        with open(file, "rb") as f:
            data = f.read().replace(tmp.encode(), b"@TMP@")
        parts.append(host_text(data) if file == source else data)
    return _digest([p.replace(tmp, "@TMP@") if isinstance(p, str) else p for p in parts])


def _run_tail_reusing_host(plan: Plan, tmp: str) -> None:
    """fatbinary; the host object from the folder or compiled now; the bytes' object; merged."""
    assert plan.reuse is not None
    fatbinary, host_cc = plan.tail
    _run_chain(plan.env, [fatbinary])
    if fatbinary.returncode != 0:
        return
    embedded = next(
        (
            t.partition("=")[2]
            for t in _tokens(fatbinary.command)
            if t.startswith("--embedded-fatbin=")
        ),
        None,
    )
    name = f"__wb_fatbin_{_digest([plan.module_id[1]])[:16]}"
    bytes_c = _split_fatbin(embedded, name) if embedded else None
    if embedded is None or bytes_c is None:  # a layout this script does not know: nvcc's tail
        _run_chain(plan.env, [host_cc])
        return
    tokens = _tokens(host_cc.command)
    out_at = tokens.index("-o") + 1
    output, host_o = tokens[out_at], os.path.join(tmp, "host.o")
    reuse = plan.reuse
    reuse.key = _host_key(host_cc, tmp, embedded)
    cached = os.path.join(reuse.folder, f"{reuse.key}.o")
    host_cc.started = time.monotonic()
    if _take(cached, host_o, host_cc):
        reuse.hit = True
        host_cc.ended = time.monotonic()
    else:
        tokens[out_at] = host_o
        host_cc.command = shlex.join(tokens)
        _run_chain(plan.env, [host_cc])
        if host_cc.returncode != 0:
            return
        _keep(host_o, cached, host_cc)
    bytes_src = os.path.join(tmp, "fatbin_bytes.c")
    with open(bytes_src, "w") as f:
        f.write(bytes_c)
    cc = tokens[0]
    steps = [
        Step("fatbin-bytes", shlex.join([cc, "-c", "-x", "c", bytes_src, "-o", f"{bytes_src}.o"])),
        Step("merge", shlex.join([cc, "-r", "-nostdlib", host_o, f"{bytes_src}.o", "-o", output])),
    ]
    plan.steps += steps
    _run_chain(plan.env, steps)


def _take(cached: str, dest: str, step: Step) -> bool:
    """Copy a kept host object and replay what its compile printed; False: none kept."""
    try:
        with open(f"{cached}.json") as f:
            log = json.load(f)
        shutil.copyfile(cached, dest)
    except (OSError, ValueError):
        return False
    os.utime(cached)
    step.returncode, step.stdout, step.stderr = 0, log["stdout"].encode(), log["stderr"].encode()
    return True


KEEP = 4  # host objects kept per source: the newest, by use


def _keep(obj: str, cached: str, step: Step) -> None:
    """Keep the host object (written whole, then renamed) and prune the folder's oldest."""
    folder = os.path.dirname(cached)
    os.makedirs(folder, exist_ok=True)
    fd, part = tempfile.mkstemp(dir=folder, suffix=".part")
    os.close(fd)
    shutil.copyfile(obj, part)
    with open(f"{part}.json", "w") as f:
        json.dump(
            {
                "stdout": step.stdout.decode(errors="replace"),
                "stderr": step.stderr.decode(errors="replace"),
            },
            f,
        )
    os.replace(part, cached)
    os.replace(f"{part}.json", f"{cached}.json")  # last: a kept object has its log
    kept = sorted(
        (os.path.join(folder, n) for n in os.listdir(folder) if n.endswith(".o")),
        key=lambda p: os.stat(p).st_mtime,
        reverse=True,
    )
    for old in kept[KEEP:]:
        for path in (old, f"{old}.json"):
            with contextlib.suppress(OSError):
                os.remove(path)


def write_times(plan: Plan | None, path: str, wall: float) -> None:
    """Each pass's seconds, and whether the host object was reused, as JSON at ``path``."""
    steps = [] if plan is None else plan.steps
    record = {
        "wall": round(wall, 4),
        "pipeline": plan is not None,
        "passes": [
            {"kind": s.kind, "seconds": round(s.ended - s.started, 4)}
            for s in steps
            if s.returncode is not None
        ],
        "host_reused": bool(plan and plan.reuse and plan.reuse.hit),
    }
    with open(path, "w") as f:
        json.dump(record, f)


def _options(argv: list[str]) -> tuple[dict[str, str], list[str]]:
    """This script's own options, then the nvcc command."""
    own: dict[str, str] = {}
    while argv and argv[0] in ("--reuse-host", "--times") and len(argv) > 1:
        own[argv[0]] = argv[1]
        argv = argv[2:]
    return own, argv


def main(argv: Sequence[str]) -> int:
    own, rest = _options(list(argv[1:]))
    if not rest:
        print(
            "usage: nvcc_pipeline.py [--reuse-host DIR] [--times FILE] NVCC ARGS...",
            file=sys.stderr,
        )
        return 2
    nvcc, args = rest[0], rest[1:]
    out = args[args.index("-o") + 1] if "-o" in args[:-1] else "."
    tmp = tempfile.mkdtemp(prefix=".nvcc-", dir=os.path.dirname(os.path.abspath(out)))
    start = time.monotonic()
    plan = None
    try:
        # WB_NVCC_PIPELINE=0: ninja.launchers never calls it
        plan = make_plan(nvcc, args, tmp, own.get("--reuse-host"))
        if plan is None:
            code = subprocess.run([nvcc, *args], check=False).returncode
        else:
            code = run(plan, tmp)
        if "--times" in own:
            write_times(plan, own["--times"], time.monotonic() - start)
        return code
    finally:
        shutil.rmtree(tmp, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main(sys.argv))
