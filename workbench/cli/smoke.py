"""compile every TU of every op family for every arch (no GPU needed), link what this torch
allows, run every CPU check; print a table and exit 1 on any failure"""

from __future__ import annotations

import argparse
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING
from xml.etree import ElementTree

from workbench.cli.common import families_of, op_names, print_json, project_of
from workbench.cli.table import render
from workbench.project import Family, Project

if TYPE_CHECKING:
    from workbench.build import Built
    from workbench.config import Config

# sm_80, sm_86 and sm_89 (A100; RTX 30, A10; L4, L40, RTX 40) run the mma.sync path, each with its
# own register allocation; sm_90a runs wgmma.
DEFAULT_ARCHS = "sm_80,sm_86,sm_89,sm_90a"
HEADERS = ["op", "TU", "arch", "seconds", "regs", "spills", "smem", "verdict"]


@dataclass
class Row:
    op: str  # the op family (compile and link rows) or the op (check rows)
    tu: str
    arch: str
    seconds: float | None
    regs: int | None = None
    spills: int | None = None  # bytes stored and loaded
    smem: int | None = None  # bytes of static shared memory
    verdict: str = "OK"
    detail: str = ""

    @property
    def failed(self) -> bool:
        return self.verdict.startswith("FAIL")


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("ops", nargs="*", metavar="OP", help="ops or op families (default: all)")
    p.add_argument("--arch", default=DEFAULT_ARCHS, help=f"target archs (default {DEFAULT_ARCHS})")
    p.add_argument("--junit", type=Path, metavar="PATH", help="also write JUnit XML here")
    p.add_argument("--json", action="store_true", help="print the rows as JSON")
    p.add_argument("-j", "--jobs", type=int, help="parallel compiles")


@dataclass
class PtxasUsage:
    regs: int = 0
    spills: int = 0
    smem: int = 0


def parse_ptxas(text: str) -> dict[str, PtxasUsage]:
    """Per arch, the most registers and shared memory of any kernel and the spilled bytes."""
    usage: dict[str, PtxasUsage] = {}
    current: PtxasUsage | None = None
    for line in text.splitlines():
        if m := re.search(r"Compiling entry function '.*' for '(\w+)'", line):
            current = usage.setdefault(m.group(1), PtxasUsage())
        elif current is None:
            continue
        elif m := re.search(r"(\d+) bytes spill stores, (\d+) bytes spill loads", line):
            current.spills += int(m.group(1)) + int(m.group(2))
        elif m := re.search(r"Used (\d+) registers", line):
            current.regs = max(current.regs, int(m.group(1)))
            if s := re.search(r"(\d+) bytes smem", line):
                current.smem = max(current.smem, int(s.group(1)))
    return usage


def run(args: argparse.Namespace) -> int:
    from workbench import toolchain

    try:
        archs = toolchain.parse_arch_list(args.arch)
    except ValueError as e:
        raise SystemExit(f"wb smoke: --arch: {e}") from None
    project = project_of(args)
    rows: list[Row] = []
    for family in families_of(project, args.ops):
        rows += compile_rows(project, family, archs, args.jobs)
        rows += check_rows(args, project, family)
    if args.json:
        print_json([r.__dict__ for r in rows])
    else:
        print(render(HEADERS, [_cells(r) for r in rows]))
        for r in rows:
            if r.failed:
                print(f"\n{r.op} {r.tu} [{r.arch}] failed:\n{r.detail}")
    if args.junit:
        write_junit(args.junit, rows)
    failed = sum(r.failed for r in rows)
    print(f"{len(rows) - failed} ok, {failed} failed")
    return 1 if failed else 0


def smoke_config(archs: tuple[str, ...]) -> Config:
    """The build ``wb smoke`` makes: ``archs``, ptxas's report kept (registers, spills), linked
    where this torch has CUDA. One config, so one cache entry: whatever else builds a family with
    it (a test reading a TU's cubins) shares the smoke compile's objects."""
    from workbench import toolchain
    from workbench.config import make_config

    return make_config(archs=archs, link=toolchain.torch_info().cuda is not None, ptxas_info=True)


def compile_rows(
    project: Project, family: Family, archs: tuple[str, ...], jobs: int | None
) -> list[Row]:
    """One row per host TU, per (CUDA TU, arch), and for the link."""
    from workbench import build, device
    from workbench.errors import WorkbenchError

    start = time.perf_counter()
    try:
        config = smoke_config(archs)
        built = build.ensure(project, family, config, jobs)
    except WorkbenchError as e:
        secs = time.perf_counter() - start
        return [Row(family.name, "build", ",".join(archs), secs, verdict="FAIL", detail=str(e))]
    rows = []
    for tu in built.manifest["tus"]:
        log = build.compile_log(str(tu["key"]))
        name = _short(Path(tu["source"]))
        raw = log.get("seconds")
        tu_secs = float(raw) if raw is not None else None
        if tu["kind"] != "cuda":
            rows.append(Row(family.name, name, "host", tu_secs))
            continue
        usage = parse_ptxas(str(log.get("output", "")))
        for arch in archs:
            u = usage.get(arch)
            if u is None:
                verdict = "OK (PTX)" if arch.startswith("compute_") else "OK (no kernel)"
                rows.append(Row(family.name, name, arch, tu_secs, verdict=verdict))
            else:
                rows.append(Row(family.name, name, arch, tu_secs, u.regs, u.spills, u.smem))
    link = "OK" if built.library is not None else "skipped: CPU torch"
    rows.append(Row(family.name, "link", ",".join(archs), None, verdict=link))
    if device.has_modules(family, config):
        rows += device_rows(project, family, config, built)
    return rows


def device_rows(project: Project, family: Family, config: Config, built: Built) -> list[Row]:
    """One row per (device-only TU, arch): NVRTC's cubin for the kernels the launchers name."""
    from workbench import device, lister
    from workbench.errors import WorkbenchError

    start = time.perf_counter()
    try:
        kernels = lister.listed_kernels(project, family, config, built)
        modules = device.ensure(project, family, config, kernels)
    except WorkbenchError as e:
        secs = time.perf_counter() - start
        arch = ",".join(config.archs)
        return [Row(family.name, "device", arch, secs, verdict="FAIL", detail=str(e))]
    rows = []
    named = {m.source for m in modules}
    for m in modules:
        for arch in dict.fromkeys(i.arch for i in m.images):  # a cubin per chunk of kernels
            total, seconds = PtxasUsage(), 0.0
            for image in [i for i in m.images if i.arch == arch]:
                record = image.record()
                u = parse_ptxas(str(record.get("log", ""))).get(arch, PtxasUsage())
                total.regs, total.smem = max(total.regs, u.regs), max(total.smem, u.smem)
                total.spills += u.spills
                seconds += float(record.get("seconds") or 0.0)
            row = Row(family.name, _short(m.source), arch, seconds, total.regs, total.spills)
            row.smem, row.verdict = total.smem, "OK (NVRTC)"
            rows.append(row)
    for src in family.sources:
        if src.kind == "device" and src.path not in named:
            verdict = "OK (no launcher names it)"
            rows.append(Row(family.name, _short(src.path), "-", None, verdict=verdict))
    return rows


def check_rows(args: argparse.Namespace, project: Project, family: Family) -> list[Row]:
    """Every CPU check of the family's ops, in a namespace of their own (``<ns>_smoke``)."""
    import workbench
    from workbench.errors import WorkbenchError
    from workbench.verify import check_op

    start = time.perf_counter()
    try:
        lib = workbench.load(
            project.kernels_dir,
            namespace=f"{project.namespace}_smoke",
            families=[family.name],
            devices="cpu",
        )
    except WorkbenchError as e:
        secs = time.perf_counter() - start
        return [Row(family.name, "check", "cpu", secs, verdict="FAIL", detail=str(e))]
    rows = []
    for name in op_names(family, project):
        spec = lib.specs.get(name)
        if spec is None or "cpu" not in spec.devices:
            rows.append(Row(name, "check", "cpu", None, verdict="skipped: no CPU spec"))
            continue
        t0 = time.perf_counter()
        results = check_op(getattr(lib, name), spec, "cpu")
        bad = [r for r in results if not r.passed]
        verdict = f"PASS {len(results)}" if not bad else f"FAIL {len(bad)} of {len(results)}"
        detail = "\n".join(f"{r.dtype} {r.label}: {r.detail}" for r in bad[:10])
        rows.append(
            Row(name, "check", "cpu", time.perf_counter() - t0, verdict=verdict, detail=detail)
        )
    return rows


def write_junit(path: Path, rows: list[Row]) -> None:
    suite = ElementTree.Element(
        "testsuite",
        name="wb smoke",
        tests=str(len(rows)),
        failures=str(sum(r.failed for r in rows)),
        skipped=str(sum(r.verdict.startswith("skipped") for r in rows)),
    )
    for r in rows:
        case = ElementTree.SubElement(
            suite,
            "testcase",
            classname=f"wb.smoke.{r.op}",
            name=f"{r.tu} [{r.arch}]",
            time=f"{r.seconds or 0:.3f}",
        )
        if r.failed:
            ElementTree.SubElement(case, "failure", message=r.verdict).text = r.detail
        elif r.verdict.startswith("skipped"):
            ElementTree.SubElement(case, "skipped", message=r.verdict)
    path.parent.mkdir(parents=True, exist_ok=True)
    ElementTree.ElementTree(suite).write(path, encoding="utf-8", xml_declaration=True)


def _cells(r: Row) -> list[object]:
    def num(v: int | None) -> object:
        return "-" if v is None else v

    secs = "-" if r.seconds is None else f"{r.seconds:.2f}"
    return [r.op, r.tu, r.arch, secs, num(r.regs), num(r.spills), num(r.smem), r.verdict]


def _short(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"
