"""Packaging: the workbench's C++ trees travel inside the package as ``workbench/_data``.

The registry headers (``kernels/include``, ``bindings/include``), the library entry points
(``bindings/registry.cpp``), the drop-in's compat layer (``bindings/compat``), the standalone
bindings (``bindings/python``) and the bundled op families (``kernels/<family>``) are compiled
at run time, so a wheel must carry them. ``workbench/project.py`` finds them under
``workbench/_data`` when installed and beside the package in a checkout; an editable install
keeps using the checkout's files, so nothing is copied for it. Everything else is in
pyproject.toml.
"""

import shutil
from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
TREES = ("kernels", "bindings")
SKIP = shutil.ignore_patterns("__pycache__", "*.pyc", ".*")


class BuildPyWithData(build_py):
    """build_py, then copy the C++ trees into the built package (not for an editable install)."""

    def run(self) -> None:
        super().run()
        if getattr(self, "editable_mode", False):
            return
        dest = Path(self.build_lib) / "workbench" / "_data"
        shutil.rmtree(dest, ignore_errors=True)  # a family removed since the last build goes
        for tree in TREES:
            shutil.copytree(ROOT / tree, dest / tree, ignore=SKIP)


setup(cmdclass={"build_py": BuildPyWithData})
