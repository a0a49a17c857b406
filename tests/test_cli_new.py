"""``wb new``: families named like the registry's own C++ names build, and the global options
(--kernels, --namespace) are accepted after the subcommand as well as before it."""

from __future__ import annotations

import argparse
import shlex
from pathlib import Path

import pytest
import torch

import workbench
from workbench import scaffold
from workbench.cli import COMMANDS, main, parser
from workbench.project import discover

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


def _files_under(folder: Path) -> set[Path]:
    return {p for p in folder.rglob("*")} if folder.exists() else set()


def test_wb_new_writes_into_a_kernels_folder_of_any_name_where_check_finds_it(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ops = tmp_path / "ops"
    assert main(["new", "demo_ops", "--kernels", str(ops)]) == 0
    assert main(["--kernels", str(ops), "new", "other_ops"]) == 0
    out = capsys.readouterr().out
    assert (ops / "demo_ops" / "spec.py").is_file()
    assert (tmp_path / "bindings" / "demo_ops.cpp").is_file()
    assert (tmp_path / "bindings" / "other_ops.cpp").is_file()
    assert not (tmp_path / "kernels").exists()
    # Discovery of that folder finds both families, each with its binding.
    found = {f.name: f for f in discover(ops).families}
    assert set(found) == {"demo_ops", "other_ops"}
    for family in found.values():
        assert any(s.kind == "binding" and s.path.is_file() for s in family.sources)
    # The command printed as the next step runs and checks the new op.
    (line,) = [ln for ln in out.splitlines() if ln.startswith("next:") and "demo_ops" in ln]
    command = shlex.split(line.split("`")[1])
    assert command[:4] == ["wb", "--kernels", str(ops), "check"]
    code = main([*command[1:], "--device", "cpu", "--trials", "1", "--no-contract"])
    table = capsys.readouterr().out
    assert code == 0, table
    assert "demo_ops  cpu" in table and "PASS" in table


def test_wb_new_over_an_existing_file_writes_nothing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ops = tmp_path / "ops"
    binding = tmp_path / "bindings" / "mine.cpp"
    binding.parent.mkdir()
    binding.write_text("// my own binding\n")
    assert main(["new", "mine", "--kernels", str(ops)]) == 2
    err = capsys.readouterr().err
    assert str(binding) in err and "nothing was written" in err
    assert binding.read_text() == "// my own binding\n"
    assert _files_under(tmp_path) == {binding.parent, binding}


def test_wb_new_that_fails_half_way_leaves_nothing_behind(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ops = tmp_path / "ops"
    (tmp_path / "bindings").write_text("a file where the bindings folder goes\n")
    assert main(["new", "half", "--kernels", str(ops)]) == 2
    err = capsys.readouterr().err
    assert "cannot write op family 'half'" in err and "bindings" in err
    assert _files_under(tmp_path) == {tmp_path / "bindings"}


# Words torch's schema parser reads as its own tokens: the load failed with
# "expected ident but found 'class'" and took the other families down with it.
SCHEMA_KEYWORDS = ("class", "def", "return", "import", "if", "for", "and", "or", "not", "while")


@pytest.mark.parametrize(
    "name", [*SCHEMA_KEYWORDS, "lambda", "int", "template", "xor_eq", "co_await", "name"]
)
def test_wb_new_refuses_names_that_cannot_load_before_writing(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], name: str
) -> None:
    assert main(["new", name, "--kernels", str(tmp_path / "ops")]) == 2
    err = capsys.readouterr().err
    assert f"op family name {name!r} is " in err
    assert "keyword" in err or "attribute of every torch.ops namespace" in err
    assert _files_under(tmp_path) == set()


def test_every_name_torchs_schema_parser_refuses_is_refused() -> None:
    words = sorted(scaffold.CPP_KEYWORDS | scaffold.PYTHON_KEYWORDS | {"match", "type", "x"})
    refused_by_torch = []
    for word in words:
        try:
            torch._C.parse_schema(f"{word}(Tensor x, float alpha) -> Tensor")
        except RuntimeError:
            refused_by_torch.append(word)
    assert set(SCHEMA_KEYWORDS) <= set(refused_by_torch)
    for word in refused_by_torch:
        why = "is a Python keyword" if word.islower() else "must be lower case"  # True, None
        with pytest.raises(ValueError, match=f"{word!r} {why}"):
            scaffold.check_name(word)
    for word in ("match", "type", "x", "f16"):  # soft keywords and plain names are fine
        assert scaffold.check_name(word) == word
