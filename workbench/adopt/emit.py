"""The C++ texts of an adopted family, from a :class:`~workbench.adopt.plan.Plan`: pure
functions from the plan to file texts.

- ``NAME.kernel.cu``: the kernels and the device code they use, as written (a device-only TU);
- ``NAME_shared.h``: constants, enums, aliases and macros both sides use (when there are any);
- ``NAME.h`` / ``NAME.cu``: one torch-free launcher per kernel (a template's in the header);
- ``bindings/NAME.cpp``: the sources' host code, launches rewritten to call the launchers,
  ``TORCH_LIBRARY`` blocks turned into ``WB_DEF`` and ``TORCH_LIBRARY_IMPL`` into ``WB_IMPL``.
"""

from __future__ import annotations

import re

from workbench.adopt import cpu
from workbench.adopt.lexer import directive
from workbench.adopt.parse import Item, Unit
from workbench.adopt.plan import Launch, Plan
from workbench.adopt.signature import param_decls, template_params

# Includes that go nowhere: the Python bindings, which the registry does not use.
_DROPPED = re.compile(r"[<\"](?:Python\.h|torch/python\.h|pybind11/[^>\"]*)[>\"]")


def _scope_name(opener: str, anon: str) -> str | None:
    m = re.match(r"(?:inline\s+)?namespace\s*([\w:]*)\s*\{", opener)
    if m is None:
        return None  # extern "C"
    return m.group(1) or anon


def qualified(item: Item, anon: str) -> str:
    parts = [_scope_name(o, anon) for o in item.scope]
    return "::".join([p for p in parts if p] + [item.name])


def chunk(u: Unit, it: Item, edits: list[tuple[int, int, str]] = ()) -> str:  # type: ignore[assignment]
    """The item's text with the comment lines just above it, after ``edits`` (offsets)."""
    start = it.lead
    nl = u.text.find("\n", start, it.start)
    start = nl + 1 if nl >= 0 else it.start
    return apply(u.text, start, it.end, edits)


def apply(text: str, start: int, end: int, edits: list[tuple[int, int, str]]) -> str:
    out = []
    pos = start
    for s, e, new in sorted(e for e in edits if start <= e[0] and e[1] <= end):
        if s < pos:
            continue
        out.append(text[pos:s])
        out.append(new)
        pos = e
    out.append(text[pos:end])
    return "".join(out)


def scoped(parts: list[tuple[tuple[str, ...], str]], anon: str) -> str:
    """Texts in their namespaces, opening and closing them as the scope changes."""
    out: list[str] = []
    current: tuple[str, ...] = ()
    for scope, text in [*parts, ((), "")]:
        scope = tuple(re.sub(r"^namespace\s*\{", f"namespace {anon} {{", o) for o in scope)
        common = 0
        while common < min(len(scope), len(current)) and scope[common] == current[common]:
            common += 1
        for opener in reversed(current[common:]):
            out.append(f"\n}}  // {opener.rstrip('{').strip()}\n")
        for opener in scope[common:]:
            out.append(f"\n{opener}\n")
        current = scope
        if text:
            out.append("\n" + text.strip("\n") + "\n")
    return "".join(out)


def _kernel_edits(it: Item) -> list[tuple[int, int, str]]:
    """A kernel keeps external linkage in its TU: the module looks it up by its lowered name."""
    toks = it.tokens
    return [(t.start, toks[k + 1].start, "") for k, t in enumerate(toks[:-1]) if t.text == "static"]


def names(plan: Plan) -> dict[int, str]:
    """The launcher stem of each kernel (its name; a suffix where two share one)."""
    out: dict[int, str] = {}
    taken: set[str] = set()
    for _, it in plan.kernels:
        stem = it.name
        k = 2
        while stem in taken:
            stem = f"{it.name}_{k}"
            k += 1
        taken.add(stem)
        out[id(it)] = stem
    return out


def kernel_cu(plan: Plan, name: str) -> str:
    anon = f"{name}_local"
    parts = []
    for u, it in plan.device:
        edits = _kernel_edits(it) if "__global__" in it.specifiers else []
        parts.append((it.scope, chunk(u, it, edits)))
    sources = ", ".join(sorted({u.path.name for u, _ in plan.device}))
    shared = f'#include "{name}/{name}_shared.h"\n' if plan.shared else ""
    return (
        f"// {name}.kernel.cu: the device code of the {name} family, a device-only TU.\n"
        f"// Moved here by wb adopt from {sources}.\n//\n"
        f"// NVRTC compiles this file alone, for the kernels the launchers in {name}.cu and\n"
        f"// {name}.h name, and the library loads it as a module: an edit here reloads in a\n"
        "// module swap (no host compile, link or dlopen). Device code only: no host function,\n"
        "// no CUDA runtime or torch header.\n"
        f"//   Check and time:  wb check {name} --device cuda\n"
        f'#include "wb/types.h"\n{shared}' + scoped(parts, anon)
    )


def shared_h(plan: Plan, name: str) -> str:
    parts = [(it.scope, chunk(u, it)) for u, it in plan.shared]
    return (
        f"// {name}_shared.h: constants, types and macros that the host code and the kernels of\n"
        f"// the {name} family both use (moved here by wb adopt). Torch-free: included by\n"
        f"// {name}.kernel.cu (NVRTC) and bindings/{name}.cpp.\n"
        '#pragma once\n\n#include "wb/types.h"\n' + scoped(parts, f"{name}_local")
    )


def _launcher(plan: Plan, it: Item, stem: str, name: str, body: bool) -> str:
    params = param_decls(it)
    decl = ", ".join(
        ["const LaunchConfig& config", "Stream stream", *(f"{t} {n}" for t, n in params)]
    )
    head = ""
    targs = ""
    if it.template is not None:
        tps = template_params(it)
        # The kernel's own parameter list, defaults included: a launch may leave them out.
        raw = (
            " ".join(t.text for t in it.template).replace(" ,", ",").replace("class ", "typename ")
        )
        head = f"template <{raw}>\n"
        targs = "".join(f", {n}" if k == "type" else f", wb::Val<{n}>" for k, n in tps)
    sig = f"{head}Status launch_{stem}({decl})"
    if not body:
        return sig + ";\n"
    args = ", ".join(["config", "stream", *(n for _, n in params)])
    return (
        f"{sig} {{\n"
        "  // An empty grid launches nothing (a <<<0, ...>>> launch would fail).\n"
        "  if (config.grid.x == 0 || config.grid.y == 0 || config.grid.z == 0) return nullptr;\n"
        f"  return wb::kernel<&k_{stem}{targs}>.launch({args});\n}}\n"
    )


def _device_template(it: Item, stem: str, name: str) -> str:
    return (
        f'WB_DEVICE_TEMPLATE(k_{stem}, "{name}.kernel.cu", "{qualified(it, name + "_local")}");\n'
    )


def launcher_h(plan: Plan, name: str) -> str:
    stems = names(plan)
    out = [
        f"// {name}.h: the launchers of the {name} family's kernels ({name}.kernel.cu) and its\n"
        f"// CPU functions ({name}.cpp), written by wb adopt. Torch-free: included by {name}.cu\n"
        f"// and bindings/{name}.cpp.\n"
        "// Each takes the kernel's own parameters after its launch configuration and stream;\n"
        f"// a template's is defined here, so that bindings/{name}.cpp instantiates it for the\n"
        "// types it launches.\n"
        '#pragma once\n\n#include "wb/module.h"\n'
    ]
    if plan.shared:
        out.append(f'#include "{name}/{name}_shared.h"\n')
    out += [f"{i}\n" for i in cpu.includes(plan.cpu)]
    if plan.cpu:
        decls = [(it.scope, cpu.declaration(u, it)) for u, it in plan.cpu]
        out.append(f"\n// The CPU functions of {name}.cpp.\n" + scoped(decls, f"{name}_local"))
    if not plan.kernels:
        return "".join(out)
    out.append(f"\nnamespace wb::{name}_family {{\n")
    for _, it in plan.kernels:
        stem = stems[id(it)]
        out.append("\n")
        if it.template is not None:
            out.append(_device_template(it, stem, name))
            out.append(_launcher(plan, it, stem, name, body=True))
        else:
            out.append(_launcher(plan, it, stem, name, body=False))
    out.append(f"\n}}  // namespace wb::{name}_family\n")
    return "".join(out)


def cpu_cpp(plan: Plan, name: str, sources: str) -> str:
    head = f"// {name}.cpp: the CPU code of the {name} family (torch-free), moved by wb adopt.\n"
    if not plan.cpu:
        return head + (
            f"//\n// The CPU ops of {sources} are written on at::Tensor, so they are in\n"
            f"// bindings/{name}.cpp with the rest of the host code. Torch-free CPU loops can\n"
            f"// move here (declared in {name}.h), as kernels/scale/scale.cpp does.\n"
            f"//   Check:  wb check <op> --device cpu\n"
        )
    parts = [(it.scope, chunk(u, it)) for u, it in plan.cpu]
    return (
        head
        + f"// Declared in {name}.h; bindings/{name}.cpp calls them.\n"
        + "#include <cstddef>\n#include <cstdint>\n"
        + "".join(f"{i}\n" for i in cpu.includes(plan.cpu))
        + scoped(parts, f"{name}_local")
    )


def launcher_cu(plan: Plan, name: str) -> str:
    stems = names(plan)
    out = [
        f"// {name}.cu: the CUDA launchers of the {name} family (host code; the kernels are in\n"
        f"// {name}.kernel.cu). Written by wb adopt: one per kernel the sources launched.\n"
        f"//   Check and time:  wb check {name} --device cuda\n"
        f'#include "{name}/{name}.h"\n\nnamespace wb::{name}_family {{\n'
    ]
    for _, it in plan.kernels:
        if it.template is None:
            stem = stems[id(it)]
            out.append("\n" + _device_template(it, stem, name))
            out.append(_launcher(plan, it, stem, name, body=True))
    out.append(f"\n}}  // namespace wb::{name}_family\n")
    return "".join(out)


def launch_text(lz: Launch, stem: str, name: str) -> str:
    targs = f"<{lz.targs}>" if lz.targs is not None else ""
    config = f"::wb_adopt_config({', '.join(lz.config[:3])})"
    if len(lz.config) == 4:
        st = lz.config[3].strip()
        stream = (
            "static_cast<::wb::Stream>(nullptr)"
            if st in ("0", "nullptr", "NULL")
            else f"::wb_adopt_stream({st})"
        )
    else:
        stream = "::wb_adopt_stream()"
    args = ", ".join(x for x in (config, stream, lz.args) if x)
    return (
        f'::wb::check_launch("{lz.kernel.name}", ::wb::{name}_family::launch_{stem}{targs}({args}))'
    )


def includes(u: Unit) -> list[str]:
    out = []
    for it in u.items:
        if it.kind == "pp" and it.names[:1] == ("include",):
            _, rest = directive(it.tokens[0])
            if _DROPPED.fullmatch(rest):
                continue
            rest = rest.replace("<torch/extension.h>", "<torch/all.h>")
            out.append(f"#include {rest}")
    return out
