"""What ``wb`` says to a new user: its version, readable help, an unknown op, an empty folder.

Every command that acts on ops answers an unknown op and an empty kernels folder alike: exit 2
and one readable line (the name, where it was looked for, the names there are, or how to make a
family)."""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

import workbench
from workbench import __version__, scaffold
from workbench.cli import COMMANDS, main
from workbench.errors import LoadError

# Each command that acts on ops, with the arguments it needs besides the op.
OP_COMMANDS: dict[str, list[str]] = {
    "build": [],
    "check": ["--device", "cpu"],
    "bench": ["--device", "cpu"],
    "tune": ["--device", "cpu"],
    "status": [],
    "why": [],
    "clean": [],
    "watch": ["--max-cycles", "1"],
    "smoke": ["--arch", "sm_90a"],
    "wheel": [],
}


@pytest.fixture(scope="module")
def ops(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A registry in a folder not called kernels, with one template family."""
    kernels = tmp_path_factory.mktemp("registry") / "ops"
    scaffold.write_family(kernels, "demo", shift=3.0)
    return kernels


def test_version(capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    assert capsys.readouterr().out == f"wb {__version__}\n"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_subcommand_help_is_plain_text_in_paragraphs(
    command: str, capsys: pytest.CaptureFixture[str]
) -> None:
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = capsys.readouterr().out
    assert "``" not in text and ":func:" not in text and ":class:" not in text
    assert not re.search(r"(?<![\w./-])_[a-z]\w*", text), text  # no private names
    doc = COMMANDS[command].__doc__ or ""
    if "\n\n" in doc.strip():  # a summary and more: the paragraphs stay apart
        head, _, rest = text.partition("\n\n")
        assert head.startswith("usage:")
        summary, _, body = rest.partition("\n\n")
        first = doc.strip().split("\n\n")[0].replace("``", "")
        assert summary.split() == first.split()
        assert body.split("\n\n")[0].strip() and not body.startswith("options:")


@pytest.mark.parametrize("command", sorted(OP_COMMANDS))
def test_an_empty_kernels_folder_says_how_to_make_a_family(
    command: str, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    empty = tmp_path / "ops"
    empty.mkdir()
    # (an op named, as tune and why need one: the empty folder is what is said)
    assert main([command, "demo", "--kernels", str(empty), *OP_COMMANDS[command]]) == 2
    err = capsys.readouterr().err
    assert f"no op family found in {empty}" in err
    assert f"wb new NAME --kernels {empty}" in err
    assert len(err.strip().splitlines()) == 1


def test_compile_commands_in_an_empty_folder_says_so_too(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "ops").mkdir()
    assert main(["compile-commands", "--kernels", str(tmp_path / "ops")]) == 2
    assert "no op family found in" in capsys.readouterr().err


@pytest.mark.parametrize("command", sorted(OP_COMMANDS))
def test_an_unknown_op_exits_2_naming_it_and_the_known_ones(
    command: str, ops: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    ns = f"wbmsg{os.getpid()}"
    argv = [command, "nosuch", "--kernels", str(ops), "--namespace", ns, *OP_COMMANDS[command]]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith(f"wb {command}: error: no op")
    assert "'nosuch'" in err and str(ops) in err
    assert err.endswith("known: demo")
    assert "[" not in err


def test_a_syntax_error_in_a_spec_is_one_line_naming_file_and_line(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    kernels = tmp_path / "ops"
    scaffold.write_family(kernels, "demo", shift=3.0)
    spec = kernels / "demo" / "spec.py"
    lines = spec.read_text().splitlines()
    broken = next(i for i, line in enumerate(lines) if line.startswith("def demo_reference"))
    lines[broken] = "def demo_reference(x: torch.Tensor, alpha: float) -> torch.Tensor"  # no ':'
    spec.write_text("\n".join(lines) + "\n")
    ns = f"wbsyntax{os.getpid()}"
    argv = ["check", "demo", "--kernels", str(kernels), "--namespace", ns, "--device", "cpu"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err == f"wb check: error: {spec}:{broken + 1}: SyntaxError: expected ':'\n"
    with pytest.raises(LoadError, match=rf"^{re.escape(str(spec))}:{broken + 1}: SyntaxError"):
        workbench.load(kernels, namespace=ns + "x", devices="cpu")
