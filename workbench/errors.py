"""The workbench's exceptions: each message names what went wrong and how to fix it."""

from __future__ import annotations


class WorkbenchError(Exception):
    """Base class of every error the workbench raises on purpose."""


class ToolchainError(WorkbenchError):
    """A compiler, CUDA toolkit or torch install is missing or unusable."""


class CacheError(WorkbenchError):
    """The cache directory cannot be used."""


class BuildError(WorkbenchError):
    """A compile or link failed; ``log`` holds the compiler's output."""

    def __init__(self, message: str, log: str = "") -> None:
        super().__init__(message)
        self.log = log
        # Of a load that built several families: each failed family's own error.
        self.failed: dict[str, WorkbenchError] = {}


class LoadError(WorkbenchError):
    """A built library could not be opened or registered."""
