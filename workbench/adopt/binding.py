"""``bindings/NAME.cpp`` of an adopted family: the sources' host code, edited in place.

Each source's text is kept (its comments and layout) with these edits: its includes gathered at
the top (``torch/extension.h`` read as ``torch/all.h``: the registry loads no Python module),
device code cut out (it is in ``NAME.kernel.cu``), each ``kernel<<<...>>>(args)`` made a call
of the kernel's launcher, ``TORCH_LIBRARY`` blocks turned into ``WB_DEF`` schemas (an inline
kernel into a ``CompositeExplicitAutograd`` impl) and ``TORCH_LIBRARY_IMPL(ns, KEY, m)`` into
``WB_IMPL(KEY, m)``. A ``.cu`` source's host code is built only with CUDA (``WB_WITH_CUDA``).
"""

from __future__ import annotations

from workbench.adopt import emit
from workbench.adopt.lexer import directive
from workbench.adopt.parse import Item, Unit
from workbench.adopt.plan import Plan

_HELPERS = """\
namespace {

// What a <<<grid, block, smem, stream>>> launch of the sources became (wb adopt): a
// wb::LaunchConfig and a wb::Stream for the kernel's launcher ({name}.h).
template <typename D>
::wb::Dim3 wb_adopt_dim(const D& d) {
  if constexpr (std::is_arithmetic_v<D>) {
    return ::wb::Dim3(static_cast<unsigned>(d));
  } else {
    return ::wb::Dim3(d.x, d.y, d.z);
  }
}

template <typename G, typename B>
::wb::LaunchConfig wb_adopt_config(const G& grid, const B& block, size_t smem = 0) {
  ::wb::LaunchConfig config;
  config.grid = wb_adopt_dim(grid);
  config.block = wb_adopt_dim(block);
  config.smem = static_cast<unsigned>(smem);
  return config;
}

template <typename S>
::wb::Stream wb_adopt_stream(const S& stream) {
  return static_cast<::wb::Stream>(static_cast<cudaStream_t>(stream));
}

// A launch that named no stream ran on the legacy default stream; here it runs on the
// caller's current stream, as every op of the registry does.
inline ::wb::Stream wb_adopt_stream() {
  return static_cast<::wb::Stream>(c10::cuda::getCurrentCUDAStream().stream());
}

}  // namespace
"""


def _line_span(u: Unit, it: Item) -> tuple[int, int]:
    """The item's text with the comment lines just above it."""
    nl = u.text.find("\n", it.lead, it.start)
    return (nl + 1 if nl >= 0 else it.start), it.end


def _edits(plan: Plan, u: Unit, name: str) -> list[tuple[int, int, str]]:
    moved = {id(it) for _, it in [*plan.device, *plan.shared, *plan.cpu]}
    moved |= {id(it) for du, it, _ in plan.dropped if du is u}
    stems = emit.names(plan)
    edits: list[tuple[int, int, str]] = []
    for it in u.items:
        if id(it) in moved:
            s, e = _line_span(u, it)
            edits.append((s, e, ""))
        elif it.kind == "pp":
            pp, rest = directive(it.tokens[0])
            if pp == "include" or (pp == "pragma" and rest == "once"):
                edits.append((it.start, it.end, ""))
        elif it.kind == "function" and "__host__" in it.specifiers:
            edits += [(t.start, t.end, "") for t in it.tokens if t.text == "__host__"]
    for b in plan.blocks:
        if b.unit is not u:
            continue
        if b.macro == "TORCH_LIBRARY_IMPL":
            head = f"WB_IMPL({b.key}, {b.var})"
            if b.key == "CUDA" and not u.is_cuda:  # its kernels are defined only with CUDA
                head = f"#ifdef WB_WITH_CUDA\n{head}"
                edits.append((b.item.end, b.item.end, "\n#endif  // WB_WITH_CUDA"))
            edits.append((b.item.start, b.head_end, head))
            continue
        inline = [(op, impl) for op, _, impl in b.defs if impl is not None]
        text = "".join(
            f'WB_IMPL(CompositeExplicitAutograd, {b.var}) {{ {b.var}.impl("{op}", {impl}); }}\n'
            for op, impl in inline
        )
        note = f"// {b.macro}({b.namespace}): its schemas are the WB_DEF lines at the top.\n"
        edits.append((b.item.start, b.item.end, note + text))
    for lz in plan.launches:
        if lz.unit is u:
            edits.append((lz.start, lz.end, emit.launch_text(lz, stems[id(lz.kernel)], name)))
    return edits


def binding_cpp(plan: Plan, name: str) -> str:
    cpu = [u for u in plan.units if not u.is_cuda]
    cuda = [u for u in plan.units if u.is_cuda]
    sources = ", ".join(u.path.name for u in plan.units)
    schemas = [schema for b in plan.blocks for _, schema, _ in b.defs]
    out = [
        f"// bindings/{name}.cpp: host side of the {name} family (schemas, checks, allocation,\n"
        f"// launches), adopted by wb adopt from {sources}.\n//\n"
        f"// The schemas of TORCH_LIBRARY({plan.namespace}) are the WB_DEF lines below; the ops\n"
        "// are torch.ops.<the registry's namespace>.<op>. Kernels are launched through the\n"
        f"// launchers of kernels/{name}/{name}.h; their code is in {name}.kernel.cu.\n"
    ]
    top = list(dict.fromkeys(i for u in cpu for i in emit.includes(u)))
    shared = [f'#include "{name}/{name}_shared.h"'] if plan.shared else []
    if plan.kernels or plan.cpu:  # torch-free: CPU builds read it too
        shared.append(f'#include "{name}/{name}.h"')
    out += [
        *top,
        *shared,
        '#include "wb/binding.h"',
        "#ifdef WB_WITH_CUDA",
        "#include <type_traits>",
    ]
    out += ['#include "wb/binding_cuda.h"']
    cuda_includes = [i for u in cuda for i in emit.includes(u) if i not in top]
    out += [*dict.fromkeys(cuda_includes), "#endif", ""]
    out += [f"WB_DEF({_c_string(s)});" for s in schemas]
    wrap = plan.wrap
    for group, guard in ((cpu, False), (cuda, True)):
        if not group:
            continue
        if guard:
            out += ["", "#ifdef WB_WITH_CUDA", "", _HELPERS.replace("{name}", name)]
        for u in group:
            body = emit.apply(u.text, 0, len(u.text), _edits(plan, u, name)).strip("\n")
            space = f"{u.path.stem}_{u.path.suffix[1:]}"
            out.append(f"\n// ---- from {u.path.name}")
            out.append(f"namespace {space} {{\n{body}\n}}  // namespace {space}" if wrap else body)
        if guard:
            out.append("\n#endif  // WB_WITH_CUDA")
    text = "\n".join(out) + "\n"
    while "\n\n\n\n" in text:
        text = text.replace("\n\n\n\n", "\n\n\n")
    return text


def _c_string(s: str) -> str:
    return '"' + s.replace("\\", "\\\\").replace('"', '\\"').replace("\n", " ") + '"'
