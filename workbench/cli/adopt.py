"""make a registry family out of a torch.utils.cpp_extension-style extension

Reads the sources (a .cpp with TORCH_LIBRARY and the CPU code, a .cu with __global__ kernels,
their launchers and TORCH_LIBRARY_IMPL) and writes family NAME: the kernels and the device
code they use in NAME.kernel.cu (a device-only TU: an edit reloads by a module swap), their
launchers in NAME.h / NAME.cu, the host code and registrations in bindings/NAME.cpp, and a
spec.py whose references are stubs to fill in (or the functions --reference names). The
sources are left as they are. A construct that cannot be split safely is named with its
file:line, and then nothing is written; nor is anything written over an existing family.
"""

from __future__ import annotations

import argparse
from pathlib import Path


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("sources", nargs="+", metavar="SOURCE", help="the extension's .cpp/.cu files")
    p.add_argument("--name", required=True, help="the family's name: its folder and C++ names")
    p.add_argument(
        "--reference",
        action="append",
        default=[],
        metavar="[OP=]MODULE:FUNCTION",
        help="a Python reference of an op (OP= may be left out when there is one op); "
        "repeat per op. Default: a stub to fill in",
    )


def run(args: argparse.Namespace) -> int:
    from workbench.adopt import adopt
    from workbench.cli.common import kernels_to_write, writing_family

    kernels = kernels_to_write(args, f"wb --kernels DIR adopt ... --name {args.name}")
    with writing_family(args.name, kernels):
        done = adopt([Path(s) for s in args.sources], args.name, kernels, args.reference)
    for path in done.written:
        print(path)
    for line in done.dropped:
        print(f"left out: {line}")
    where = f"--kernels {args.kernels} " if args.kernels else ""
    print(
        f"ops {', '.join(done.ops)} (TORCH_LIBRARY({done.namespace}) in the sources) are now "
        f"torch.ops.<the registry's namespace>.<op>"
    )
    if not args.reference:
        print(f"next: write the references in {kernels / args.name / 'spec.py'}, then ", end="")
    else:
        print("next: ", end="")
    print(f"`wb {where}check {' '.join(done.ops)}`")
    return 0
