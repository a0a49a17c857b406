"""``wb new``: families named like the registry's own C++ names build, and the global options
(--kernels, --namespace) are accepted after the subcommand as well as before it."""

from __future__ import annotations

import argparse
from pathlib import Path

import pytest
import torch

import workbench
from workbench import scaffold
from workbench.cli import COMMANDS, main, parser

# Names that namespace wb already holds (wb::f16, wb::data) or that the template calls
# (wb::elementwise_cpu is what a family "elementwise" would shadow with its elementwise_cpu).
CLASHING = ("f16", "data", "elementwise")


def _subcommands(p: argparse.ArgumentParser) -> dict[str, argparse.ArgumentParser]:
    (action,) = [a for a in p._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(action.choices)


def test_every_subcommand_takes_the_global_options_after_it() -> None:
    subs = _subcommands(parser())
    assert set(subs) == set(COMMANDS)
    for name, sub in subs.items():
        options = {s for a in sub._actions for s in a.option_strings}
        assert {"--kernels", "--namespace"} <= options, name


@pytest.mark.parametrize(
    ("argv", "kernels", "namespace"),
    [
        (["--kernels", "A", "status"], "A", None),
        (["status", "--kernels", "B", "--namespace", "ns"], "B", "ns"),
        (["--kernels", "A", "--namespace", "x", "status", "--kernels", "B"], "B", "x"),
    ],
)
def test_the_option_after_the_subcommand_wins_and_the_other_is_kept(
    argv: list[str], kernels: str, namespace: str | None
) -> None:
    args = parser().parse_args(argv)
    assert (args.kernels, args.namespace) == (kernels, namespace)


def test_wb_new_in_both_orders_writes_families_that_build_and_run(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kernels = tmp_path / "kernels"
    kernels.mkdir()
    first, *rest = CLASHING
    assert main(["new", first, "--kernels", str(kernels)]) == 0  # the order issue 20 hit
    for name in rest:
        assert main(["--kernels", str(kernels), "new", name]) == 0
    out = capsys.readouterr().out
    assert f"wb --kernels {kernels} check f16" in out
    header = (kernels / "f16" / "f16.h").read_text()
    assert "namespace wb::f16_family {" in header
    lib = workbench.load(kernels, namespace="wbnew", devices="cpu")
    x = torch.arange(4, dtype=torch.float32)
    for name in CLASHING:  # alpha * x + 1, the template's shift
        assert torch.equal(getattr(lib, name)(x, 2.0), 2 * x + 1), name


@pytest.mark.parametrize("name", ["include", "_hidden", "F16", "9lives"])
def test_wb_new_refuses_names_discovery_would_skip_or_misread(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    assert main(["new", name, "--kernels", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert repr(name) in err
    if name in scaffold.RESERVED:
        assert "reserved: include" in err
    assert not (tmp_path / name).exists()


@pytest.mark.nvcc
def test_the_cuda_kernel_of_a_family_named_f16_compiles(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kernels = tmp_path / "kernels"
    scaffold.write_family(kernels, "f16")
    code = main(["smoke", "--kernels", str(kernels), "--arch", "sm_90a", "-j", "1"])
    out = capsys.readouterr().out
    assert code == 0, out
    assert "f16/f16.cu" in out
