"""A family's spec.py is run when its text is new and imported lazily once its facts are known
(workbench.specfile): a warm load registers stand-ins that import it at their first call."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import warnings
from pathlib import Path

import pytest
import torch
from registry_fixture import write_registry

import workbench
from workbench import knobs, loader

SPEC = """\
import os
import torch
from workbench.spec import OpSpec, Sample, randn

FACTOR = {factor}


def add_offset_reference(x):
    return x + 1


def add_offset_samples(dtype, device, gen):
    return [Sample((randn((8,), dtype, device, gen),), "8")]


def add_offset_fake(x):
    return torch.empty_like(x)


def add_offset_backward(ctx, grad):
    return grad * FACTOR


OPS = [
    OpSpec(
        name="add_offset",
        reference=add_offset_reference,
        samples=add_offset_samples,
        fake=add_offset_fake,
        backward=None if os.environ.get("SPEC_NO_BACKWARD") else add_offset_backward,
        dtypes=(torch.float32, torch.float64),
        devices=("cpu",),
    ),
]
"""


def registry(root: Path, factor: int = 1) -> Path:
    kernels = write_registry(root)
    (kernels / "tiny" / "spec.py").write_text(SPEC.format(factor=factor))
    return kernels


def grad_of(lib: workbench.Library) -> torch.Tensor:
    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    (grad,) = torch.autograd.grad(lib.add_offset(x).sum(), x)
    return grad


CHILD = r"""
import json, sys
import torch
import workbench
lib = workbench.load(sys.argv[1], namespace="specwarm", devices="cpu")
module = "workbench._specs.specwarm.tiny"
after_load = {"spec": module in sys.modules, "workbench.spec": "workbench.spec" in sys.modules}
x = torch.ones(4, dtype=torch.float64, requires_grad=True)
(grad,) = torch.autograd.grad(lib.add_offset(x).sum(), x)
from torch._subclasses.fake_tensor import FakeTensorMode
with FakeTensorMode() as mode:
    shape = list(lib.add_offset(mode.from_tensor(torch.empty(5, 3))).shape)
print(json.dumps({"after_load": after_load, "grad": grad.tolist(), "fake_shape": shape,
                  "imported": module in sys.modules}))
"""


def test_a_warm_load_registers_the_spec_without_running_it(tmp_path: Path) -> None:
    kernels = registry(tmp_path, factor=3)
    first = workbench.load(kernels, namespace="specwarm", devices="cpu")  # runs it: new text
    assert grad_of(first).tolist() == [3.0] * 4
    env = {**os.environ, "WB_CACHE_DIR": knobs.get("WB_CACHE_DIR") or "", "WB_QUIET": "1"}
    env["PYTHONPATH"] = os.pathsep.join([str(Path(workbench.__file__).parent.parent)])
    out = subprocess.run(
        [sys.executable, "-c", CHILD, str(kernels)], env=env, capture_output=True, text=True
    )
    assert out.returncode == 0, out.stderr
    seen = json.loads(out.stdout.strip().splitlines()[-1])
    # The load neither ran the spec.py nor imported the module its OpSpecs come from ...
    assert seen["after_load"] == {"spec": False, "workbench.spec": False}
    # ... and its backward and fake function ran, imported at their first call.
    assert seen["grad"] == [3.0] * 4 and seen["fake_shape"] == [5, 3] and seen["imported"]


def test_an_edited_spec_runs_at_load_and_reregisters(tmp_path: Path) -> None:
    kernels = registry(tmp_path, factor=2)
    lib = workbench.load(kernels, namespace="specedit", devices="cpu")
    assert grad_of(lib).tolist() == [2.0] * 4
    spec = kernels / "tiny" / "spec.py"
    spec.write_text(SPEC.format(factor=5))
    lib.reload()
    assert grad_of(lib).tolist() == [5.0] * 4  # the new text's backward
    assert lib.specs["add_offset"].backward is not None
    spec.write_text(SPEC.format(factor="1 // 0"))  # a new text that fails when run
    with pytest.raises(ZeroDivisionError):
        workbench.load(kernels, namespace="specbroken", devices="cpu")


def test_a_spec_that_declares_other_facts_than_its_record_warns(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A spec.py whose OPS depend on the environment: the record of its text (with a backward)
    stands for it at a later load; importing it then finds no backward and says so."""
    kernels = registry(tmp_path, factor=4)
    workbench.load(kernels, namespace="specfacts1", devices="cpu")
    monkeypatch.setenv("SPEC_NO_BACKWARD", "1")
    lib = workbench.load(kernels, namespace="specfacts2", devices="cpu")
    with pytest.warns(RuntimeWarning, match="declares other ops"):
        specs = lib.specs
    assert specs["add_offset"].backward is None
    x = torch.ones(4, dtype=torch.float64, requires_grad=True)
    with pytest.raises(Exception, match="has no backward now"):
        torch.autograd.grad(lib.add_offset(x).sum(), x)
    lib.reload()  # registers what the spec declares now, and records it
    assert loader.registered_spec("specfacts2", "add_offset").backward is None
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert lib.specs["add_offset"].backward is None
