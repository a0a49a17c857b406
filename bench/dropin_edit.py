"""Edit to new result of a drop-in C++ source: with a precompiled torch header, without, torch's.

The source is what a research script hands ``torch.utils.cpp_extension.load``: one ``.cpp`` that
includes ``torch/extension.h``, defines a CPU function and registers it with ``TORCH_LIBRARY``.
Each edit changes a constant in the function's body; the time runs from writing the file to the
edited op's correct result.

- ``dropin``: ``workbench.load(name, sources)`` in one process: a cold load, then ``--edits``
  edits, each loaded again in the same process (the precompiled header is made at the first
  edit, so that edit is reported on its own and the median is over the edits after it);
- ``dropin, no header``: the same with ``WB_DROPIN_PCH=0``;
- ``torch load``: ``torch.utils.cpp_extension.load`` of the same source; an in-process reload of a
  ``TORCH_LIBRARY`` op aborts the process, so every edit runs in a new process (its start and
  ``import torch`` counted), with its own build folder as torch keeps it.

Usage: python -m bench dropin_edit [--edits 4] [--no-torch] [--out F]
Prints the environment line and a markdown table last.
"""

from __future__ import annotations

import json
import statistics
import tempfile
from pathlib import Path

from bench.common import child_env, environment, markdown_table, parser, run_python, write_text

SOURCE = """\
#include <torch/extension.h>

at::Tensor my_op_cpu(const at::Tensor& input, const at::Tensor& other, double alpha) {
  return input + other * alpha + STEP;
}

TORCH_LIBRARY(NAMESPACE, m) {
  m.def("my_op(Tensor input, Tensor other, float alpha) -> Tensor");
}

TORCH_LIBRARY_IMPL(NAMESPACE, CPU, m) { m.impl("my_op", &my_op_cpu); }
"""

# One process: a cold load, then each edit loaded again in place; prints a JSON line of seconds.
IN_PROCESS = """
import json, sys, time
from pathlib import Path
import torch, workbench
src, text, ns, edits = Path(sys.argv[1]), sys.argv[2], sys.argv[3], int(sys.argv[4])
x = torch.ones(3)
def step(k):
    start = time.perf_counter()
    src.write_text(text.replace("STEP", str(k)))
    workbench.load(ns, [str(src)], is_python_module=False)
    got = getattr(torch.ops, ns).my_op(x, x, 2.0)
    assert torch.equal(got, x * 3 + k), (got, k)
    return time.perf_counter() - start
print(json.dumps([step(k) for k in range(edits + 1)]))
"""

# One new process per edit: torch's load of the file as written, then the op's result.
TORCH_LOAD = """
import sys
import torch
from torch.utils.cpp_extension import load
src, ns, k = sys.argv[1], sys.argv[2], int(sys.argv[3])
load(ns, [src], is_python_module=False)
x = torch.ones(3)
assert torch.equal(getattr(torch.ops, ns).my_op(x, x, 2.0), x * 3 + k)
"""


def in_process(work: Path, edits: int, pch: bool) -> list[float]:
    ns = f"dropin_{'pch' if pch else 'plain'}"
    src = work / f"{ns}.cpp"
    env = child_env(work / f"cache_{ns}", WB_DROPIN_PCH="1" if pch else "0")
    text = SOURCE.replace("NAMESPACE", ns)
    ran = run_python(IN_PROCESS, str(src), text, ns, str(edits), env=env, what=ns)
    return [float(s) for s in json.loads(ran.last_line)]


def torch_load(work: Path, edits: int) -> list[float]:
    ns = "dropin_torch"
    src = work / f"{ns}.cpp"
    env = child_env(None, tree=None, TORCH_EXTENSIONS_DIR=str(work / "torch_extensions"))
    seconds = []
    for k in range(edits + 1):
        src.write_text(SOURCE.replace("NAMESPACE", ns).replace("STEP", str(k)))
        seconds.append(run_python(TORCH_LOAD, str(src), ns, str(k), env=env, what=ns).wall)
    return seconds


def row(name: str, seconds: list[float], made_header: bool) -> list[object]:
    cold, edits = seconds[0], seconds[1:]
    first = f"{edits[0]:.2f}" if made_header else "-"
    steady = edits[1:] if made_header else edits
    return [name, f"{cold:.2f}", first, f"{statistics.median(steady):.2f}", len(steady)]


def main(argv: list[str] | None = None) -> int:
    p = parser(__name__, __doc__)
    p.add_argument("--edits", type=int, default=4, help="edits per path (at least 2)")
    p.add_argument("--no-torch", action="store_true", help="skip torch's own load")
    p.add_argument("--out", type=Path, help="also write the table here")
    args = p.parse_args(argv)
    if args.edits < 2:
        raise SystemExit("--edits must be at least 2: the first edit makes the header")
    with tempfile.TemporaryDirectory(prefix="wb-dropin-edit-") as tmp:
        work = Path(tmp)
        rows = [
            row("dropin", in_process(work, args.edits, pch=True), made_header=True),
            row("dropin, no header", in_process(work, args.edits, pch=False), made_header=False),
        ]
        if not args.no_torch:
            rows.append(row("torch load", torch_load(work, args.edits), made_header=False))
    head = ["path", "cold s", "edit that makes the header s", "edit s (median)", "edits"]
    text = f"{environment().line('cpu')}\n{markdown_table(head, rows, 'lrrrr')}\n"
    write_text(args.out, text)
    print(text, end="")
    return 0
