"""Progress for ``wb build`` and ``wb watch`` (:class:`Progress`), ``wb check`` and ``wb bench``
(:class:`Steps`): one live line on a terminal, plain lines otherwise (CI logs, pipes).

ninja reports an edge when it finishes, so "compiling" names the first unfinished TUs, as
many as run in parallel.
"""

from __future__ import annotations

import sys
import threading
import time
from pathlib import Path
from typing import TextIO


class LiveLine:
    """One status line redrawn in place on a terminal (``live``), by a ticker thread while a step
    runs so its seconds go on; a subclass says what the line reads (:meth:`status`)."""

    interval = 0.2  # seconds between redraws

    def __init__(self, stream: TextIO | None, live: bool | None) -> None:
        self.stream = stream or sys.stderr
        self.live = self.stream.isatty() if live is None else live
        self.start = time.monotonic()
        self._lock = threading.Lock()  # the subclass's fields
        self._write = threading.Lock()  # the stream
        self._stop = threading.Event()
        self._ticker: threading.Thread | None = None

    def status(self) -> str:
        raise NotImplementedError

    def _draw(self) -> None:
        line = self.status()
        with self._write:
            self.stream.write("\r\x1b[K" + line)
            self.stream.flush()

    def _line(self, text: str) -> None:
        with self._write:
            self.stream.write(text + "\n")
            self.stream.flush()

    def _start_ticker(self) -> None:
        if self._ticker is not None:
            return

        def tick() -> None:
            while not self._stop.wait(self.interval):
                self._draw()

        self._ticker = threading.Thread(target=tick, daemon=True)
        self._ticker.start()

    def _end(self) -> None:
        """Stop the ticker and clear the live line (before a table or the next family)."""
        self._stop.set()
        if self._ticker is not None:
            self._ticker.join()
            self._ticker = None
        if self.live:
            with self._write:
                self.stream.write("\r\x1b[K")
                self.stream.flush()
        self._stop.clear()


class Progress(LiveLine):
    """Implements :class:`workbench.build.Progress`."""

    def __init__(self, stream: TextIO | None = None, live: bool | None = None) -> None:
        super().__init__(stream, live)
        self.family = ""
        self.pending: list[Path] = []
        self.total = 0
        self.parallel = 1
        self.note_text = ""

    # build.Progress
    def started(self, family: str, sources: list[Path], parallel: int) -> None:
        with self._lock:
            self.family, self.pending, self.total = family, list(sources), len(sources)
            self.parallel, self.start, self.note_text = parallel, time.monotonic(), ""
        if self.live:
            self._start_ticker()
        else:
            self._line(f"{family}: compiling {self.total} TU(s), -j {parallel}")

    def finished(self, family: str, source: Path) -> None:
        with self._lock:
            if source in self.pending:
                self.pending.remove(source)
            done = self.total - len(self.pending)
        if not self.live:
            self._line(f"{family}: [{done}/{self.total} {self._elapsed():.1f} s] {_short(source)}")
        else:
            self._draw()

    def note(self, family: str, text: str) -> None:
        with self._lock:
            self.family, self.note_text = family, text
        if self.live:
            self._draw()
        else:
            self._line(f"{family}: {text}")

    # drawing
    def status(self) -> str:
        """The live line: which TU is compiling, how many are left, elapsed seconds."""
        with self._lock:
            running = ", ".join(_short(p) for p in self.pending[: self.parallel])
            left = len(self.pending)
            what = f"compiling {running}" if running else self.note_text
            if running and self.note_text.startswith("waiting"):
                what = self.note_text
        return f"{self.family}: {what} · {left} of {self.total} left · {self._elapsed():.1f} s"

    def done(self) -> None:
        """End the live line (call once the family's build returned or failed)."""
        self._end()

    def _elapsed(self) -> float:
        return time.monotonic() - self.start


def _short(path: Path) -> str:
    return f"{path.parent.name}/{path.name}"


class Steps(LiveLine):
    """Progress of ``wb check`` and ``wb bench``, which print nothing else for minutes: on a
    terminal one live line (the op, what is running on it, steps done of the total, elapsed
    seconds, redrawn while a step runs); otherwise one line per op as it starts (CI logs,
    pipes)."""

    interval = 0.5

    def __init__(
        self, command: str, total: int, stream: TextIO | None = None, live: bool | None = None
    ) -> None:
        super().__init__(stream, live)
        self.command, self.total, self.finished = command, total, 0
        self.op = ""
        self.what = ""
        self.text = ""

    def begin(self, op: str, what: str) -> None:
        """Step ``what`` (e.g. "cpu float32") of ``op`` starts."""
        with self._lock:
            self.text, self.what = f"{op} {what}", what
            first_of_op, self.op = op != self.op, op
        if self.live:
            self._draw()
            self._start_ticker()
        elif first_of_op:
            self._line(self.status())

    def detail(self, text: str) -> None:
        """What runs within the current step (a check's name, a size, a timing round): shown on
        the live line only; plain output keeps its one line per op."""
        with self._lock:
            self.text = f"{self.op} {self.what}: {text}" if text else f"{self.op} {self.what}"
        if self.live:
            self._draw()

    def step_done(self, steps: int = 1) -> None:
        with self._lock:
            self.finished += steps

    def status(self) -> str:
        elapsed = time.monotonic() - self.start
        return (
            f"wb {self.command}: {self.text} · {self.finished} of {self.total} done · "
            f"{elapsed:.1f} s"
        )

    def done(self) -> None:
        """End the live line (before the table is printed)."""
        self._end()
