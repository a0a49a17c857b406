"""``wb smoke``: every TU of every bundled family compiles for every default arch (sm_80, sm_86,
sm_89, sm_90a) with nvcc (no GPU needed), the link runs where this torch allows it, every CPU
check passes; a TU that fails for one arch fails the run, in the table and in the JUnit XML.

The bundled run uses the default archs, as CI's smoke stage does: on CI that stage then finds every
object and cubin in the cache this test filled, and only writes its JUnit XML.
"""

from __future__ import annotations

from pathlib import Path
from xml.etree import ElementTree

import pytest
import torch

from workbench.cli import main
from workbench.cli.smoke import parse_ptxas
from workbench.project import BUNDLED_KERNELS, discover

ARCHS = ("sm_80", "sm_86", "sm_89", "sm_90a")  # wb smoke's default

PTXAS = """\
ptxas info    : Compiling entry function '_Z1kPfi' for 'sm_80'
ptxas info    : Function properties for _Z1kPfi
    8 bytes stack frame, 4 bytes spill stores, 12 bytes spill loads
ptxas info    : Used 40 registers, used 1 barriers, 256 bytes smem, 364 bytes cmem[0]
ptxas info    : Compiling entry function '_Z1gPfi' for 'sm_80'
ptxas info    : Used 10 registers, 380 bytes cmem[0]
"""


def test_parse_ptxas_takes_the_worst_kernel_per_arch() -> None:
    usage = parse_ptxas(PTXAS)
    assert list(usage) == ["sm_80"]
    assert (usage["sm_80"].regs, usage["sm_80"].spills, usage["sm_80"].smem) == (40, 16, 256)


def test_smoke_compiles_for_every_arch_of_the_mma_path_by_default() -> None:
    """sm_80, sm_86 and sm_89 run the mma.sync path (each allocates its registers), sm_90a wgmma:
    a plain ``wb smoke`` prints the registers and spills of each."""
    import argparse

    from workbench import toolchain
    from workbench.cli.smoke import add_parser

    parser = argparse.ArgumentParser()
    add_parser(parser)
    archs = toolchain.parse_arch_list(parser.parse_args([]).arch)
    assert archs == ARCHS


@pytest.mark.nvcc
def test_smoke_compiles_links_and_checks_the_bundled_kernels(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    junit = tmp_path / "smoke.xml"
    code = main(["smoke", "--junit", str(junit)])  # the default archs: ARCHS
    out = capsys.readouterr().out
    assert code == 0, out
    rows = [line.split() for line in out.splitlines()[2:] if line and not line[0].isdigit()]
    for family in discover().families:
        for cu in sorted((BUNDLED_KERNELS / family.name).glob("*.cu")):
            for arch in ARCHS:
                (row,) = [
                    r for r in rows if r[:3] == [family.name, f"{family.name}/{cu.name}", arch]
                ]
                if row[-3:] == ["OK", "(no", "kernel)"]:  # host code only (matmul.cu picks a path)
                    assert "__global__" not in cu.read_text(), row
                else:
                    assert row[4].isdigit() and int(row[4]) > 0  # registers, from -Xptxas -v
                    # a device-only TU's cubin comes from NVRTC, every other TU's from nvcc
                    device_only = cu.name.endswith(".kernel.cu")
                    assert row[-2:] == ["OK", "(NVRTC)"] if device_only else row[-1] == "OK"
        (link,) = [r for r in rows if r[:2] == [family.name, "link"]]
        cpu_torch = torch.version.cuda is None
        assert link[-3:] == ["skipped:", "CPU", "torch"] if cpu_torch else link[-1] == "OK"
    checks = [r for r in rows if r[1:3] == ["check", "cpu"]]
    assert len(checks) >= 4 and all(r[-2] == "PASS" for r in checks)
    suite = ElementTree.parse(junit).getroot()
    assert suite.get("failures") == "0" and int(suite.get("tests", 0)) == len(rows)
    assert_every_cubin_is_plain_and_read()


def assert_every_cubin_is_plain_and_read() -> None:
    """Each nvcc object of the run keeps its cubins uncompressed (nvcc compresses large ones by
    default: softmax.cu's sm_90a cubin), and the reload's reader finds kernels in it for each
    arch whose compile ptxas reported kernels for."""
    from workbench import build, cubin, resources
    from workbench.cli.smoke import smoke_config

    project, config = discover(), smoke_config(ARCHS)
    read = 0
    for family in project.families:
        for tu in build.ensure(project, family, config).manifest["tus"]:
            if tu["kind"] != "cuda":
                continue
            key = str(tu["key"])
            entries = list(cubin.fatbin_entries(build.object_path(key).read_bytes()))
            assert not [sm for _, sm, p in entries if p[:4] == cubin.ZSTD_MAGIC], tu["source"]
            reported = parse_ptxas(str(build.compile_log(key).get("output", "")))
            for arch in ARCHS:
                if arch in reported:
                    assert resources._read_object(key, arch), (tu["source"], arch)
                    read += 1
    assert read >= 4 * len(project.families)


BROKEN_CU = """\
__global__ void twice(float* x, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ == 800
  this_does_not_compile_for_sm_80;
#endif
  if (i < n) x[i] *= 2;
}
"""


@pytest.mark.nvcc
def test_smoke_fails_on_a_tu_that_does_not_compile_for_one_arch(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from tests.registry_fixture import write_registry

    kernels = write_registry(tmp_path)
    (kernels / "tiny" / "twice.cu").write_text(BROKEN_CU)
    junit = tmp_path / "smoke.xml"
    code = main(
        ["--kernels", str(kernels), "smoke", "--arch", "sm_80,sm_90a", "--junit", str(junit)]
    )
    out = capsys.readouterr().out
    assert code == 1
    assert "twice.cu" in out and "this_does_not_compile_for_sm_80" in out
    assert "FAIL" in out
    suite = ElementTree.parse(junit).getroot()
    assert int(suite.get("failures", 0)) >= 1
