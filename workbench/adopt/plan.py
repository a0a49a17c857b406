"""What ``wb adopt`` moves where: the kernels and the device code they use, the launches to
rewrite, the registrations, and every construct that cannot be split safely (a Refusal each).

Sources are matched by name at namespace scope: a kernel that names an identifier which an item
of the sources defines takes that item along (a ``__device__`` function, a ``__constant__``, a
type, a constant, a macro). What the host code names as well is shared: constants, enums,
aliases and macros go into one header both sides include; a function, record or template used
on both sides is refused, as is anything in device code that needs torch or a host function.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from workbench.adopt.lexer import directive
from workbench.adopt.parse import Item, Unit, match, split_commas
from workbench.adopt.registration import Block, Refusal, read_block
from workbench.adopt.signature import kernel_param_refusals

DEVICE_VARS = frozenset({"__device__", "__constant__", "__shared__", "__managed__"})
TORCH_NAMES = frozenset({"at", "c10", "torch", "caffe2", "std", "pybind11", "py"})
TORCH_PREFIXES = ("AT_", "C10_", "TORCH_", "PYBIND11_")
_HALF_DISPATCH = re.compile(r"AT_DISPATCH_\w*(HALF|BFLOAT16|REDUCED|COMPLEX|AND\d?|V2)\w*")


@dataclass
class Launch:
    """A ``kernel<targs><<<config>>>(args)`` in host code."""

    unit: Unit
    start: int  # offsets of the whole expression in the unit's text
    end: int
    kernel: Item
    targs: str | None  # the explicit template arguments' text
    config: list[str]  # grid, block[, smem[, stream]]
    args: str


@dataclass
class Plan:
    units: list[Unit]
    kernels: list[tuple[Unit, Item]] = field(default_factory=list)
    device: list[tuple[Unit, Item]] = field(default_factory=list)  # in source order, kernels too
    shared: list[tuple[Unit, Item]] = field(default_factory=list)
    launches: list[Launch] = field(default_factory=list)
    blocks: list[Block] = field(default_factory=list)
    dropped: list[tuple[Unit, Item, str]] = field(default_factory=list)  # (unit, item, why)
    refusals: list[Refusal] = field(default_factory=list)
    # Two sources define one name at one scope (anonymous helpers of the same name in the .cpp
    # and the .cu are common): each source's host code gets a namespace of its own.
    wrap: bool = False
    cpu: list[tuple[Unit, Item]] = field(default_factory=list)  # torch-free CPU functions

    @property
    def namespace(self) -> str:
        return self.blocks[0].namespace if self.blocks else ""


def is_kernel(item: Item) -> bool:
    return item.kind in ("function", "declaration") and "__global__" in item.specifiers


def _kind(item: Item) -> str:
    """ "kernel", "device" (device code or variable), "hd" (__host__ __device__ function),
    "shareable" (a constant, enum, alias or macro), "record", "host", "pp" or "registration"."""
    if item.kind == "registration":
        return "registration"
    if item.kind == "pp":
        return "shareable" if item.names[:1] == ("define",) else "pp"
    spec = item.specifiers
    if "__global__" in spec:
        return "kernel"
    if item.kind == "function":
        if "__device__" in spec:
            return "hd" if "__host__" in spec else "device"
        return "host"
    if item.kind == "record":
        return "shareable" if "enum" in spec and item.template is None else "record"
    if spec & DEVICE_VARS:
        return "device"
    head = item.tokens[0].text if item.tokens else ""
    if head in ("using", "typedef") and item.template is None:
        return "shareable"
    if spec & {"constexpr", "const"} and "(" not in [t.text for t in item.tokens[:3]]:
        return "shareable"
    return "host"


def _refs(item: Item) -> set[str]:
    """Identifiers the item names, leaving out members (after '.' or '->')."""
    out = set()
    toks = item.tokens
    for k, t in enumerate(toks):
        if t.kind == "ident" and not (k > 0 and toks[k - 1].text in (".", "->")):
            out.add(t.text)
        elif t.kind == "pp":
            out.update(re.findall(r"[A-Za-z_]\w*", directive(t)[1]))
    return out - set(item.names[1:] if item.names[:1] == ("define",) else item.names)


def torch_use(item: Item) -> str | None:
    toks = item.tokens
    for k, t in enumerate(toks):
        if t.kind != "ident":
            continue
        nxt = toks[k + 1].text if k + 1 < len(toks) else ""
        if (t.text in TORCH_NAMES and nxt == "::") or t.text.startswith(TORCH_PREFIXES):
            return t.text + ("::" + toks[k + 2].text if nxt == "::" and k + 2 < len(toks) else "")
    return None


def make(units: list[Unit]) -> Plan:
    plan = Plan(units)
    where = {id(it): u for u in units for it in u.items}
    defs: dict[str, list[Item]] = {}
    for u in units:
        for it in u.items:
            names = it.names[1:] if it.kind == "pp" else it.names
            if it.kind == "pp" and it.names[:1] != ("define",):
                continue
            for n in names:
                defs.setdefault(n, []).append(it)
    _registrations(plan)
    kinds = {id(it): _kind(it) for u in units for it in u.items}
    device: dict[int, Item] = {}
    queue = [it for u in units for it in u.items if kinds[id(it)] == "kernel"]
    for it in queue:
        device[id(it)] = it
    while queue:
        it = queue.pop()
        for name in sorted(_refs(it)):
            for d in defs.get(name, []):
                if id(d) in device or d is it:
                    continue
                k = kinds[id(d)]
                if k == "host":
                    plan.refusals.append(
                        Refusal(
                            where[id(d)].where(d.line),
                            f"host function or variable {name!r}, used by device code "
                            f"{it.name!r} ({where[id(it)].where(it.line)})",
                            "device code can call only __device__ functions: mark it "
                            "__device__ (or __host__ __device__ in a header both include)",
                        )
                    )
                    continue
                if k in ("device", "hd", "shareable", "record", "kernel"):
                    device[id(d)] = d
                    queue.append(d)
    _host_side(plan, kinds, device, where)
    for u in units:
        for it in u.items:
            if id(it) not in device:
                continue
            if kinds[id(it)] == "kernel" and it.kind == "function":  # not a forward declaration
                plan.kernels.append((u, it))
            if it in [s for _, s in plan.shared]:
                continue
            plan.device.append((u, it))
            _check_device_item(plan, u, it)
    _check_files(plan)
    _collisions(plan, set(device))
    return plan


def _collisions(plan: Plan, moved: set[int]) -> None:
    seen: dict[tuple[tuple[str, ...], str], Unit] = {}
    defined: dict[str, Unit] = {}
    prototypes: list[tuple[Unit, Item]] = []
    for u in plan.units:
        for it in u.items:
            if it.kind in ("pp", "registration") or id(it) in moved:
                continue
            texts = [t.text for t in it.tokens]
            if it.kind == "declaration" and "(" in texts and "=" not in texts:
                prototypes.append((u, it))
                continue
            if it.kind == "function":
                defined.setdefault(it.name, u)
            if it.kind in ("function", "record") or "=" in texts:
                for n in it.names:
                    if seen.setdefault((it.scope, n), u) is not u:
                        plan.wrap = True
    if not plan.wrap:
        return
    for u, it in prototypes:
        other = defined.get(it.name)
        if other is not None and other is not u:
            plan.refusals.append(
                Refusal(
                    u.where(it.line),
                    f"{it.name!r} declared here and defined in {other.path.name}, while the "
                    "sources also define one name twice (each source's host code then gets a "
                    "namespace of its own in the binding)",
                    "rename the helpers the sources both define, so one namespace holds them",
                )
            )


def _registrations(plan: Plan) -> None:
    for u in plan.units:
        for it in u.items:
            other = it.kind == "function" and "TORCH_LIBRARY" in it.name
            if it.kind != "registration" and not other:
                continue
            if other:
                plan.refusals.append(
                    Refusal(
                        u.where(it.line),
                        f"registration macro {it.name}",
                        "adopt reads TORCH_LIBRARY, TORCH_LIBRARY_FRAGMENT and TORCH_LIBRARY_IMPL "
                        "(the stable ABI's macros and their boxed kernels are not read): "
                        "register the ops with those, or write the binding by hand",
                    )
                )
                continue
            if it.name == "PYBIND11_MODULE" and not it.body:
                plan.dropped.append(
                    (u, it, "an empty pybind11 module, which only names the library")
                )
                continue
            if it.name == "PYBIND11_MODULE":
                plan.refusals.append(
                    Refusal(
                        u.where(it.line),
                        f"pybind11 module {u.text[it.start : it.end].split('{')[0].strip()}",
                        "its functions are bound for Python, not registered as torch ops: "
                        'register them with TORCH_LIBRARY(ns, m) { m.def("schema"); } and '
                        'TORCH_LIBRARY_IMPL(ns, CPU/CUDA, m) { m.impl("op", &fn); } in place '
                        "of the module, then run wb adopt again",
                    )
                )
                continue
            block, refusals = read_block(u, it)
            plan.refusals += refusals
            if block is not None:
                plan.blocks.append(block)
    if not plan.blocks and not plan.refusals:
        plan.refusals.append(
            Refusal(
                ", ".join(f"{u.path}:1" for u in plan.units),
                "no TORCH_LIBRARY or PYBIND11_MODULE in any source",
                "nothing names the ops to adopt: register them with TORCH_LIBRARY(ns, m) "
                '{ m.def("schema"); } and TORCH_LIBRARY_IMPL in the sources',
            )
        )
    spaces = sorted({b.namespace for b in plan.blocks})
    if len(spaces) > 1:
        b = plan.blocks[-1]
        plan.refusals.append(
            Refusal(
                b.unit.where(b.item.line),
                f"registrations in {len(spaces)} namespaces ({', '.join(spaces)})",
                "a family's ops live in one namespace: adopt the sources of each namespace "
                "as a family of its own",
            )
        )
    defined = {op for b in plan.blocks for op, _, _ in b.defs}
    for b in plan.blocks:
        for op in b.impls:
            if op not in defined:
                plan.refusals.append(
                    Refusal(
                        b.unit.where(b.item.line),
                        f"{b.var}.impl of {op!r} with no {b.var}.def of it in the sources",
                        "name the source holding its TORCH_LIBRARY block too",
                    )
                )


def _host_side(
    plan: Plan, kinds: dict[int, str], device: dict[int, Item], where: dict[int, Unit]
) -> None:
    """Launches in host code, and what host code shares with device code."""
    kernels: dict[str, Item] = {}
    for it in device.values():  # a definition, where a forward declaration comes first
        if kinds[id(it)] == "kernel" and (it.kind == "function" or it.name not in kernels):
            kernels[it.name] = it
    used_by_host: dict[str, Item] = {}
    for u in plan.units:
        for it in u.items:
            if id(it) in device or kinds[id(it)] in ("pp",):
                continue
            if it.kind == "function" and it.name.startswith("PyInit_"):
                plan.dropped.append((u, it, "the Python module stub"))
                continue
            launched = _launches(plan, u, it, kernels)
            spans = [(lz.start, lz.end) for lz in launched]
            toks = [t for t in it.tokens if not any(s <= t.start < e for s, e in spans)]
            for n, t in enumerate(toks):
                if t.kind != "ident" or (n > 0 and toks[n - 1].text in (".", "->")):
                    continue
                used_by_host.setdefault(t.text, it)
                if t.text in kernels and t.text not in it.names:
                    plan.refusals.append(
                        Refusal(
                            u.where(t.line),
                            f"kernel {t.text!r} named by host code other than in a <<<...>>> "
                            "launch",
                            "a device-only TU's kernels are reached through wb::kernel "
                            "(wb/module.h): rewrite this use (cudaFuncSetAttribute, "
                            "cudaLaunchKernel, occupancy queries) by hand",
                        )
                    )
            plan.launches += launched
    for it in device.values():
        k = kinds[id(it)]
        if k == "kernel":
            continue
        defined = it.names[1:] if it.kind == "pp" else it.names
        user = next((used_by_host[n] for n in defined if n in used_by_host), None)
        if user is None:
            continue
        u = where[id(it)]
        if k == "shareable":
            plan.shared.append((u, it))
            continue
        if k == "device" and it.kind != "function":
            plan.refusals.append(
                Refusal(
                    u.where(it.line),
                    f"device variable {it.name!r} used by host code at "
                    f"{where[id(user)].where(user.line)} (cudaMemcpyToSymbol and the like)",
                    "a device-only TU's variables live in its module: read one with wb::global "
                    "(wb/module.h) in a launcher written by hand, or pass the value as a kernel "
                    "argument",
                )
            )
            continue
        what = "template" if it.template is not None else {"record": "type"}.get(k, "code")
        plan.refusals.append(
            Refusal(
                u.where(it.line),
                f"{what} {it.name!r} shared across host and device (host code at "
                f"{where[id(user)].where(user.line)} uses it, and so does device code)",
                "adopt keeps host and device code in separate files: put it in a header of "
                "kernels/NAME/ that both sides include, by hand",
            )
        )


def _launches(plan: Plan, u: Unit, it: Item, kernels: dict[str, Item]) -> list[Launch]:
    toks = it.tokens
    out = []
    for k, t in enumerate(toks):
        if t.text != "<<<":
            continue
        if it.kind != "function":
            plan.refusals.append(
                Refusal(
                    u.where(t.line),
                    "a kernel launch outside a function body",
                    "move the launch into a host function",
                )
            )
            continue
        j = k - 1
        targs = None
        if j >= 0 and toks[j].text in (">", ">>"):
            depth = 0
            while j >= 0:
                depth += toks[j].text.count(">") if toks[j].text in (">", ">>") else 0
                depth -= 1 if toks[j].text == "<" else 0
                if depth == 0:
                    break
                j -= 1
            targs = u.text[toks[j + 1].start : toks[k - 2].end] if j + 1 <= k - 2 else ""
            j -= 1
        name = toks[j] if j >= 0 else t
        kernel = kernels.get(name.text)
        if name.kind != "ident" or kernel is None or name.kind == "pp":
            plan.refusals.append(
                Refusal(
                    u.where(t.line),
                    f"a launch of {name.text!r}, which no source defines "
                    "as a __global__ function (or a macro hides it)",
                    "launch a kernel of the sources by its name, or adopt the source "
                    "that defines it",
                )
            )
            continue
        first = j
        while first >= 2 and toks[first - 1].text == "::" and toks[first - 2].kind == "ident":
            first -= 2
        close = next((m for m in range(k + 1, len(toks)) if toks[m].text == ">>>"), -1)
        if close < 0 or close + 1 >= len(toks) or toks[close + 1].text != "(":
            plan.refusals.append(
                Refusal(
                    u.where(t.line),
                    "a launch the reader cannot follow",
                    "write it as kernel<<<grid, block>>>(args)",
                )
            )
            continue
        end = match(toks, close + 1)
        config = [u.text[p[0].start : p[-1].end] for p in split_commas(toks[k + 1 : close])]
        args = u.text[toks[close + 2].start : toks[end - 1].end] if end > close + 2 else ""
        if not 2 <= len(config) <= 4:
            plan.refusals.append(
                Refusal(
                    u.where(t.line),
                    f"a launch with {len(config)} configuration values",
                    "give grid, block[, smem[, stream]]",
                )
            )
            continue
        if kernel.template is not None and _HALF_DISPATCH.search(" ".join(x.text for x in toks)):
            plan.refusals.append(
                Refusal(
                    u.where(t.line),
                    f"template kernel {kernel.name!r} launched under a "
                    "dtype dispatch that includes c10::Half or c10::BFloat16",
                    "a device-only TU has no c10 types: dispatch wb::f16/wb::bf16 "
                    "(wb/types.h) by hand, or dispatch float and double only",
                )
            )
            continue
        out.append(Launch(u, toks[first].start, toks[end].end, kernel, targs, config, args))
    return out


def _check_device_item(plan: Plan, u: Unit, it: Item) -> None:
    if it.if_depth > 0:
        plan.refusals.append(
            Refusal(
                u.where(it.line),
                f"device code {it.name!r} inside an #if block",
                "adopt does not split preprocessor conditionals: move the kernel and its "
                "#if into kernels/NAME/NAME.kernel.cu by hand",
            )
        )
    used = torch_use(it)
    if used is not None:
        plan.refusals.append(
            Refusal(
                u.where(it.line),
                f"device code {it.name!r} uses {used}",
                "a device-only TU includes no torch or C++ library header: pass raw "
                "pointers and sizes (wb/types.h has f16/bf16) instead",
            )
        )
    if is_kernel(it) and it.kind == "function":
        plan.refusals += kernel_param_refusals(u, it)


def _check_files(plan: Plan) -> None:
    for u in plan.units:
        for it in u.items:
            if it.kind != "pp":
                continue
            name, rest = directive(it.tokens[0])
            if name == "define" and re.search(r"\b__global__\b|<<<", rest):
                plan.refusals.append(
                    Refusal(
                        u.where(it.line),
                        f"macro {it.names[1]!r} hides a __global__ function or a launch",
                        "adopt cannot see what it defines: expand "
                        "the macro in the source by hand (one kernel per definition)",
                    )
                )
            if name == "include" and rest.startswith('"'):
                plan.refusals.append(
                    Refusal(
                        u.where(it.line),
                        f"#include {rest}",
                        "adopt moves no headers of yours: inline the header's code into "
                        "the sources, or adopt without it and copy it into kernels/NAME/ "
                        "by hand",
                    )
                )
