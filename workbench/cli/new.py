"""write a new op family from the template (an elementwise op that builds and passes wb check)

The family goes where ``workbench.load(DIR)`` and ``wb --kernels DIR`` find it, whatever DIR is
called: its kernels in DIR/NAME/, its binding in bindings/NAME.cpp beside DIR. Nothing is
written when any of those files exists already, nor for a name that cannot load (a Python or
C++ keyword).
"""

from __future__ import annotations

import argparse

from workbench.errors import WorkbenchError


def add_parser(p: argparse.ArgumentParser) -> None:
    p.add_argument("name", help="the family's name: its folder, C++ namespace and op name")
    p.add_argument(
        "--nvcc",
        action="store_true",
        help="put the CUDA kernel and its launcher in one NAME.cu that nvcc compiles (default: "
        "the kernel in NAME.kernel.cu, compiled by NVRTC and reloaded by a module swap)",
    )


def run(args: argparse.Namespace) -> int:
    from workbench import scaffold
    from workbench.cli.common import kernels_to_write, writing_family

    kernels = kernels_to_write(args, f"wb --kernels DIR new {args.name}")
    try:
        scaffold.check_name(args.name)
    except ValueError as e:
        raise WorkbenchError(str(e)) from e
    layout = "nvcc" if args.nvcc else "device"
    with writing_family(args.name, kernels):
        written = scaffold.create_family(kernels, args.name, layout=layout)
    for path in written:
        print(path)
    where = f"--kernels {args.kernels} " if args.kernels else ""
    print(f"next: edit the files above, then `wb {where}check {args.name}`")
    return 0
