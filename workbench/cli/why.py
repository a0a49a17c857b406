"""say which inputs changed since an op family's cached build (files, flags, env, toolchain);
for a drop-in source file (one that workbench.load compiled), where its compile time went and
what to do about it"""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path
from typing import Any

from workbench.cli.common import devices_arg, families_of, print_json, project_of
from workbench.config import Config
from workbench.errors import WorkbenchError
from workbench.project import Family, Project

SOURCE_SUFFIXES = (".cu", ".cuh", ".cpp", ".cc", ".cxx", ".c")
# The toolchain identity's fields (config.Config.identity), in words.
FIELDS = {
    "workbench": "workbench version",
    "layout": "cache layout",
    "python": "Python ABI",
    "torch": "torch version",
    "torch_git": "torch git version",
    "torch_cuda": "torch's CUDA version",
    "cxx11_abi": "torch's C++11 ABI flag",
    "cxx": "C++ compiler",
    "nvcc": "nvcc",
    "archs": "CUDA archs",
}


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("op", metavar="OP", help="an op or op family, or a drop-in source file")
    p.add_argument("--device", choices=["cpu", "cuda", "auto"], default="auto")
    p.add_argument("--json", action="store_true", help="print the changes as JSON")


def toolchain_changes(old: dict[str, Any], new: dict[str, Any]) -> list[dict[str, Any]]:
    changes = []
    for name, words in FIELDS.items():
        if old.get(name) != new.get(name):
            changes.append(_change("toolchain", words, old.get(name), new.get(name)))
    old_env, new_env = old.get("env") or {}, new.get("env") or {}
    for var in sorted(set(old_env) | set(new_env)):
        if old_env.get(var) != new_env.get(var):
            changes.append(_change("env", var, old_env.get(var), new_env.get(var)))
    return changes


def file_changes(old: dict[str, str | None], new: dict[str, str | None]) -> list[dict[str, Any]]:
    changes = []
    for path in sorted(set(old) | set(new)):
        before, after = old.get(path, "absent"), new.get(path, "absent")
        if before != after:
            changes.append(_change("file", path, before, after))
    return changes


def flag_changes(
    old_tus: list[dict[str, Any]], new_cmds: dict[str, tuple[str, ...]], ignore: str
) -> list[dict[str, Any]]:
    """Per TU, the flags added and removed (paths under ``ignore``, the PCH, are derived)."""
    changes = []
    old_cmds = {str(t["source"]): tuple(t.get("command") or ()) for t in old_tus}
    for source in sorted(set(old_cmds) | set(new_cmds)):
        if source not in old_cmds or source not in new_cmds:
            what = "new source" if source not in old_cmds else "source no longer built"
            changes.append(_change("file", source, None, what))
            continue
        before = [f for f in old_cmds[source] if ignore not in f]
        after = [f for f in new_cmds[source] if ignore not in f]
        if before != after:
            changes.append(_change("flags", source, before, after))
    return changes


def _change(kind: str, what: str, before: Any, after: Any) -> dict[str, Any]:
    return {"kind": kind, "what": what, "before": before, "after": after}


def describe(change: dict[str, Any]) -> str:
    """One change in plain words."""
    kind, what, before, after = change["kind"], change["what"], change["before"], change["after"]
    if kind == "env":
        if before is None:
            return f"env knob {what} set to {after!r} (was unset)"
        if after is None:
            return f"env knob {what} unset (was {before!r})"
        return f"env knob {what} changed from {before!r} to {after!r}"
    if kind == "toolchain":
        return f"{what} changed from {_show(before)} to {_show(after)}"
    if kind == "flags":
        added = [f for f in after if f not in before]
        removed = [f for f in before if f not in after]
        parts = [f"added {shlex.join(added)}" if added else "", f"removed {shlex.join(removed)}"]
        if not removed:
            parts.pop()
        return f"flags of {what}: " + ("; ".join(p for p in parts if p) or "reordered")
    if isinstance(after, str) and after.startswith(("new source", "source no")):
        return f"{after}: {what}"
    if before == "absent":
        return f"file added to the build: {what}"
    if after == "absent" or after is None:
        return f"file deleted: {what}"
    return f"file changed: {what}"


def _show(value: Any) -> str:
    return (
        "none" if value in (None, [], "") else repr(value) if not isinstance(value, str) else value
    )


def build_paths(family: Family, config: Config) -> list[dict[str, str]]:
    """How each TU of the family is built, and why (device-only TUs: workbench.device)."""
    out = []
    for src in family.sources:
        if src.kind == "device":
            path = "NVRTC, a cubin per arch, loaded as a module"
            why = "a device-only TU (*.kernel.cu): an edit reloads by a module swap, no host build"
            if not config.with_cuda:
                path, why = "not built", f"CUDA is off ({config.cpu_reason})"
        elif src.kind == "cuda":
            path = "nvcc, host and device code, linked into the library"
            why = (
                "an edit reloads by compile, link and dlopen; device code moved to a "
                "NAME.kernel.cu reloads by a module swap"
            )
            if not config.with_cuda:
                path, why = "not built", f"CUDA is off ({config.cpu_reason})"
        else:
            path = "host compiler, linked into the library"
            why = "torch-aware host code" if src.kind == "binding" else "a CPU kernel TU"
        out.append({"source": str(src.path), "path": path, "why": why})
    return out


def explain(project: Project, family: Family, config: Config) -> tuple[str, list[dict[str, Any]]]:
    """(headline, changes) between the newest cached build of ``family`` and the inputs now."""
    from workbench import build, inventory
    from workbench.config import pch_root
    from workbench.hashing import file_digest

    key = build.current_key(project, family, config)
    if key is not None and build.find_cached(family, key) is not None:
        return f"{family.name} is fresh: the cached build {key[:12]} matches the inputs", []
    found = inventory.entries(family.name, project.kernels_dir)
    if not found:
        return f"{family.name} was never built in this cache: nothing to compare", []
    last = found[0].manifest
    plan = build.plan_tus(project, family, config)
    new_inputs = {
        p: file_digest(p) for tu in plan for p in [str(tu.source.path), *(tu.headers or [])]
    }
    new_cmds = {str(tu.source.path): tu.command for tu in plan}
    changes = toolchain_changes(last.get("toolchain", {}), config.identity)
    changes += flag_changes(last.get("tus", []), new_cmds, str(pch_root()))
    changes += file_changes(last.get("inputs", {}), new_inputs)
    head = f"{family.name}: the cached build {str(last.get('key'))[:12]} is stale"
    if not changes:
        head += " (no input differs; a header list is unknown until the next compile)"
    return head, changes


def _is_source(arg: str) -> bool:
    return Path(arg).suffix in SOURCE_SUFFIXES or "/" in arg or Path(arg).is_file()


def dropin(arg: str, as_json: bool) -> int:
    """``wb why FILE``: the last drop-in compile of FILE, in words."""
    from workbench import cache
    from workbench.compat import timing

    path = Path(arg)
    if not path.is_file():
        raise WorkbenchError(f"{arg}: no such file; give a source that workbench.load compiled")
    entry = timing.last(path)
    if entry is None:
        raise WorkbenchError(
            f"{arg}: no drop-in compile of this file is recorded in the cache {cache.root()}; "
            "`wb why FILE` explains a source after workbench.load() (or load_inline) compiled it "
            "(set WB_CACHE_DIR to the load's build_directory if it gave one); for a registry "
            "family give its op name"
        )
    if as_json:
        print_json({**entry, "explanation": timing.explain(entry)})
        return 0
    print("\n".join(timing.explain(entry)))
    return 0


def run(args: argparse.Namespace) -> int:
    from workbench.config import make_config

    if _is_source(args.op):
        return dropin(args.op, args.json)
    project = project_of(args)
    (family,) = families_of(project, [args.op])
    config = make_config(devices_arg(args.device))
    head, changes = explain(project, family, config)
    paths = build_paths(family, config)
    if args.json:
        print_json({"summary": head, "changes": changes, "paths": paths})
        return 0
    print(head)
    for change in changes:
        print(f"  {describe(change)}")
    print("how each TU builds:")
    for p in paths:
        print(f"  {p['source']}: {p['path']} ({p['why']})")
    return 0
