"""Edit-to-result latency of hot reload, with the anchor measured in the same run.

For registries of 1 and of 30 template families (``workbench.scaffold``, what ``wb new``
writes), one process loads the registry and then, per case and repeat: writes the edited file,
calls ``lib.reload()``, runs the op and checks the result of the new code. The time is from
writing the file to that correct result. Cases: a CUDA kernel body, a CPU kernel body, a header
both kernels include, the binding. Every repeat writes a new value, so nothing comes from the
cache. Also: a reload with nothing changed, and the warm start of the registry in a new process
(``workbench.load()`` to a first result, after ``import torch``).

The anchor is ``torch.utils.cpp_extension.load`` of the same op in the conventional layout
(every TU includes torch/extension.h; the CPU kernel and the TORCH_LIBRARY binding share a TU)
for the 1-family registry. It must restart the process for every edit (an in-process reload of a
TORCH_LIBRARY op aborts it), so its time runs from writing the file to the correct result
printed by a new process, and the restart is counted.

The processes import from cached bytecode, as an installed package does, even where
PYTHONDONTWRITEBYTECODE is set.

Usage: python -m bench reload [--families 1 30] [--repeats 3] [--no-anchor] [--out F]
Prints a markdown table (and JSON) last.
"""

from __future__ import annotations

import json
import statistics
import tempfile
import time
from pathlib import Path

from bench.common import child_env, environment, one_arch_env, parser, run_python, write_text

# "device" edits the CUDA kernel of a device-only TU (NVRTC, a module swap: the default layout of
# `wb new`); "cuda" the same kernel in a family whose kernel and launcher share a .cu that nvcc
# compiles (`wb new --nvcc`); "cuda-plain" the same with nvcc run as one process
# (WB_NVCC_PIPELINE=0). The CPU, header and binding cases run on the device-only layout.
CASES = ("device", "cuda", "cuda-plain", "cpu", "header", "binding")
NVCC_CASES = ("cuda", "cuda-plain")
ALPHA = 2.0


def edit_for(case: str, family: str, k: int) -> tuple[str, str, str]:
    """(file relative to the registry root, old text, new text) of repeat ``k`` of a case."""
    if case in ("device", "cuda", "cuda-plain"):
        return (
            f"kernels/{family}/{family}{'.kernel.cu' if case == 'device' else '.cu'}",
            "{ return apply(x, alpha); }",
            f"{{ return apply(x, alpha) + A({k}); }}",
        )
    if case == "cpu":
        return (
            f"kernels/{family}/{family}.cpp",
            "{ return apply(v, a); }",
            f"{{ return apply(v, a) + {k}; }}",
        )
    if case == "header":
        return (f"kernels/{family}/{family}_math.h", "kShift = ", f"kShift = {k} + ")
    return (f"bindings/{family}.cpp", "  return out;\n}", f"  return out.add_({k});\n}}")


WORKER = """
import json, os, statistics, time
from pathlib import Path
import torch
import workbench
from bench.reload import ALPHA, edit_for

root, family, device = Path({root_dir!r}), {family!r}, {device!r}
cases, repeats = {cases!r}, {repeats}
lib = workbench.load(root / "kernels", namespace="bench")
op = getattr(lib, family)
x = torch.randn(1 << 16, device=device)
shift = float(family[2:])
assert torch.allclose(op(x, ALPHA), ALPHA * x + shift)
results = {{}}
for case in cases:
    run_on = "cpu" if case == "cpu" else device
    xx = x.to(run_on)
    rows = []
    os.environ["WB_NVCC_PIPELINE"] = "0" if case == "cuda-plain" else "1"
    # A CPU edit takes a fifth of a second: more repeats keep its median steady.
    for k in range(1, (max(repeats, 7) if case == "cpu" else repeats) + 1):
        k += 1000 if case == "cuda-plain" else 0  # values the cuda case did not write
        rel, old, new = edit_for(case, family, k)
        path = root / rel
        original = path.read_text()
        assert old in original, (rel, old)
        t0 = time.perf_counter()
        path.write_text(original.replace(old, new))
        report = lib.reload()
        out = op(xx, ALPHA)
        if run_on == "cuda":
            torch.cuda.synchronize()
        expected = ALPHA * xx + shift + k
        assert torch.allclose(out, expected, atol=1e-4), (case, k, (out - expected).abs().max())
        seconds = time.perf_counter() - t0
        rows.append(dict(seconds=seconds, compiled=len(report.compiled), **report.phases))
        path.write_text(original)
        lib.reload()
    results[case] = rows
no_change = []
for _ in range(20):
    t0 = time.perf_counter()
    report = lib.reload()
    no_change.append(time.perf_counter() - t0)
    assert not report.compiled and not report.swapped
results["no_change"] = [dict(seconds=statistics.median(no_change))]
print(json.dumps(results))
"""

WARM = """
import time, torch
t0 = time.perf_counter()
import workbench
lib = workbench.load({kernels!r}, namespace="bench")
out = getattr(lib, {family!r})(torch.ones(4), 1.0)
elapsed = time.perf_counter() - t0
assert len(lib.ops) == {count}
print(elapsed)
"""

ANCHOR_MATH = """\
#pragma once
#ifdef __CUDACC__
#define ANCHOR_HD __host__ __device__
#else
#define ANCHOR_HD
#endif
constexpr double kShift = 0.0;
template <typename A>
ANCHOR_HD A apply(A x, A alpha) { return alpha * x + static_cast<A>(kShift); }
"""

ANCHOR_CPP = """\
#include <torch/extension.h>
#include "anchor_math.h"

at::Tensor op00_cpu(const at::Tensor& x_in, double alpha) {
  at::Tensor x = x_in.contiguous();
  at::Tensor out = torch::empty(x.sizes(), x.options());
  const float* xp = x.data_ptr<float>();
  float* op = out.data_ptr<float>();
  const float a = static_cast<float>(alpha);
  at::parallel_for(0, x.numel(), 32768, [&](int64_t begin, int64_t end) {
    for (int64_t i = begin; i < end; ++i) op[i] = [a](float v) { return apply(v, a); }(xp[i]);
  });
  return out;
}

TORCH_LIBRARY(anchor, m) { m.def("op00(Tensor x, float alpha) -> Tensor"); }
TORCH_LIBRARY_IMPL(anchor, CPU, m) { m.impl("op00", &op00_cpu); }
"""

ANCHOR_CU = """\
#include <torch/extension.h>
#include <ATen/cuda/CUDAContext.h>
#include "anchor_math.h"

template <typename A>
struct Apply {
  A alpha;
  __device__ A operator()(A x) const { return apply(x, alpha); }
};

__global__ void op00_kernel(int64_t n, Apply<float> f, const float* x, float* out) {
  int64_t i = blockIdx.x * static_cast<int64_t>(blockDim.x) + threadIdx.x;
  if (i < n) out[i] = f(x[i]);
}

at::Tensor op00_cuda(const at::Tensor& x_in, double alpha) {
  at::Tensor x = x_in.contiguous();
  at::Tensor out = torch::empty(x.sizes(), x.options());
  int64_t n = x.numel();
  op00_kernel<<<(n + 255) / 256, 256, 0, at::cuda::getCurrentCUDAStream()>>>(
      n, Apply<float>{static_cast<float>(alpha)}, x.data_ptr<float>(), out.data_ptr<float>());
  return out;
}

TORCH_LIBRARY_IMPL(anchor, CUDA, m) { m.impl("op00", &op00_cuda); }
"""

ANCHOR_RUN = """
import sys, time, torch
from torch.utils.cpp_extension import load
folder, build, device, k = sys.argv[1], sys.argv[2], sys.argv[3], float(sys.argv[4])
sources = [f"{folder}/op00.cpp"] + ([f"{folder}/op00_cuda.cu"] if build == "cuda" else [])
t0 = time.perf_counter()
load(name="anchor_op00", sources=sources, is_python_module=False,
     build_directory=f"{folder}/build", extra_include_paths=[folder], verbose=False)
x = torch.randn(1 << 16, device=device)
out = torch.ops.anchor.op00(x, 2.0)
if device == "cuda":
    torch.cuda.synchronize()
ok = torch.allclose(out, 2.0 * x + k, atol=1e-4)
print("ok" if ok else "stale", time.perf_counter() - t0)
"""

ANCHOR_EDITS = {  # case -> (file, old, new with {k})
    "cuda": ("op00_cuda.cu", "{ return apply(x, alpha); }", "{{ return apply(x, alpha) + {k}; }}"),
    "cpu": ("op00.cpp", "{ return apply(v, a); }", "{{ return apply(v, a) + {k}; }}"),
    "header": ("anchor_math.h", "kShift = 0.0", "kShift = {k}.0"),
    "binding": ("op00.cpp", "  return out;\n}", "  return out.add_({k});\n}}"),
}


def bench_wb(
    count: int,
    device: str,
    cases: list[str],
    repeats: int,
    work: Path,
    env: dict[str, str],
    layout: str = "device",
) -> dict[str, object]:
    from workbench import scaffold

    root = work / f"registry{count}-{layout}"
    kernels = scaffold.write_registry(root, count, layout=layout)
    family = f"op{count // 2:02d}"
    warm_code = WARM.format(kernels=str(kernels), family=family, count=count)
    cold = run_python(warm_code, env=env).wall
    warm = statistics.median(float(run_python(warm_code, env=env).last_line) for _ in range(5))
    worker = WORKER.format(
        root_dir=str(root),
        family=family,
        device=device,
        cases=cases,
        repeats=repeats,
    )
    measured = run_python(worker, env=env).json()
    return {"cold_process": cold, "warm": warm, "family": family, **measured}


def bench_anchor(device: str, cases: list[str], work: Path, env: dict[str, str]) -> dict[str, dict]:
    """The anchor's edits accumulate (restoring a file would make the next case rebuild it)."""
    folder = work / "anchor"
    (folder / "build").mkdir(parents=True)
    files = {"op00.cpp": ANCHOR_CPP, "op00_cuda.cu": ANCHOR_CU, "anchor_math.h": ANCHOR_MATH}
    for name, text in files.items():
        (folder / name).write_text(text)
    cold = run_python(ANCHOR_RUN, str(folder), device, device, "0", env=env).wall
    results: dict[str, dict] = {"cold": {"seconds": cold}}
    shift, offsets = 0, {"cpu": 0, "cuda": 0}  # what the edits so far add, per device
    for k, case in enumerate(cases, start=1):
        name, old, new = ANCHOR_EDITS[case]
        path = folder / name
        text = path.read_text()
        run_on = "cpu" if case in ("cpu", "binding") else device
        if case == "header":
            shift = k
        else:
            offsets["cpu" if case == "binding" else case] += k
        t0 = time.perf_counter()
        path.write_text(text.replace(old, new.format(k=k)))
        expected = str(shift + offsets[run_on])
        ran = run_python(ANCHOR_RUN, str(folder), device, run_on, expected, env=env)
        seconds = time.perf_counter() - t0
        verdict, in_process = ran.last_line.split()
        wall = ran.wall
        results[case] = {
            "seconds": seconds,
            "restart": wall - float(in_process),
            "verdict": verdict,
        }
    return results


def table(device: str, wb: dict[int, dict], anchor: dict[str, dict] | None) -> str:
    counts = sorted(wb)
    head = " | ".join(f"wb, {c} famil{'y' if c == 1 else 'ies'} (s)" for c in counts)
    lines = [
        environment().line(device),
        "",
        f"| edit to first correct result | {head} | anchor, 1 family, new process (s) |",
        "| --- | " + " | ".join("---" for _ in counts) + " | --- |",
    ]
    for case in [c for c in CASES if any(c in wb[n] for n in counts)]:
        cells = []
        for c in counts:
            rows = wb[c].get(case)
            if not rows:
                cells.append("-")
                continue
            med = statistics.median(r["seconds"] for r in rows)
            comp = statistics.median(r["compile"] for r in rows)
            link = statistics.median(r["link"] for r in rows)
            dev = statistics.median(r.get("device", 0.0) for r in rows)
            what = (
                f"NVRTC + module load {dev:.2f}"
                if case == "device"
                else (f"compile {comp:.2f}, link {link:.2f}")
            )
            cells.append(f"{med:.2f} ({rows[0]['compiled']} TU; {what})")
        a = anchor.get(case if case != "device" else "cuda") if anchor else None
        a_cell = f"{a['seconds']:.2f} (restart {a['restart']:.2f}; {a['verdict']})" if a else "-"
        lines.append(f"| {case} | {' | '.join(cells)} | {a_cell} |")
    no_change = " | ".join(f"{wb[c]['no_change'][0]['seconds'] * 1e3:.1f} ms" for c in counts)
    warm = " | ".join(f"{wb[c]['warm'] * 1e3:.0f} ms" for c in counts)
    cold = " | ".join(f"{wb[c]['cold_process']:.1f}" for c in counts)
    a_cold = f"{anchor['cold']['seconds']:.1f}" if anchor else "-"
    lines += [
        f"| reload with nothing changed (median of 20) | {no_change} | - |",
        f"| warm start in a new process, after import torch (median of 5) | {warm} | - |",
        f"| cold build, new process, empty cache (s) | {cold} | {a_cold} |",
    ]

    def med(count: int, case: str) -> float | None:
        rows = wb[count].get(case)
        return statistics.median(x["seconds"] for x in rows) if rows else None

    if len(counts) > 1:
        base, big = counts[0], counts[-1]
        ratios = []
        for case in CASES:
            a, b = med(base, case), med(big, case)
            if a and b:
                ratios.append(f"{case} {b / a:.2f}x")
        lines += ["", f"{big}-family / {base}-family edit time: {', '.join(ratios)}"]
    first = counts[0]
    dev, nv = med(first, "device"), med(first, "cuda")
    if dev and nv:
        text = f"device-only edit / nvcc edit ({first} famil{'y' if first == 1 else 'ies'}): "
        text += f"{dev / nv:.2f}x"
        if anchor and "cuda" in anchor:
            text += f"; / cpp_extension.load: {dev / anchor['cuda']['seconds']:.3f}x"
        lines += ["", text]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    p = parser(__name__, __doc__)
    p.add_argument("--families", type=int, nargs="+", default=[1, 30])
    p.add_argument(
        "--nvcc-families",
        type=int,
        nargs="*",
        default=[1],
        help="registry sizes for the nvcc-layout cases (cuda, cuda-plain); default 1",
    )
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--no-anchor", action="store_true")
    p.add_argument("--anchor-only", action="store_true", help="measure only the anchor")
    p.add_argument("--anchor-cases", nargs="+", choices=list(ANCHOR_EDITS), help="default: all")
    p.add_argument("--out", type=Path, help="also write the table here (markdown)")
    args = p.parse_args(argv)
    if args.repeats < 1 or any(n < 1 for n in args.families):
        p.error("--repeats and --families must be >= 1")
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    cases = [c for c in CASES if device == "cuda" or c not in ("device", *NVCC_CASES)]
    anchor_cases = [c for c in cases if c in (args.anchor_cases or ANCHOR_EDITS)]
    with tempfile.TemporaryDirectory(prefix="wb-reload-") as tmp:
        work = Path(tmp)
        env = one_arch_env(child_env(work / "cache"))  # one arch for both tools
        if args.anchor_only:
            print(f"anchor: {json.dumps(bench_anchor(device, anchor_cases, work, env))}")
            return
        wb = {}
        own = [c for c in cases if c not in NVCC_CASES]
        nvcc = [c for c in cases if c in NVCC_CASES]
        for count in args.families:
            wb[count] = bench_wb(count, device, own, args.repeats, work, env)
            print(f"wb, {count} families: {json.dumps(wb[count])}", flush=True)
        for count in args.nvcc_families if nvcc else []:
            result = bench_wb(count, device, nvcc, args.repeats, work, env, layout="nvcc")
            print(f"wb (nvcc layout), {count} families: {json.dumps(result)}", flush=True)
            wb.setdefault(count, {}).update({c: result[c] for c in nvcc})
        anchor = None if args.no_anchor else bench_anchor(device, anchor_cases, work, env)
        if anchor:
            print(f"anchor: {json.dumps(anchor)}", flush=True)
    text = table(device, wb, anchor)
    print(text)
    write_text(args.out, text)
