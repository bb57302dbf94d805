"""Renders registry progress events like Ollama's CLI, on stderr.

On a terminal: a live list of status lines and one bar per layer
(``pulling 8de95da68dc4:  45% ▕████      ▏ 158 MB/352 MB   12 MB/s   16s``).
Elsewhere (pipes, CI): one plain line per status and per finished layer.
"""

from __future__ import annotations

from rich.console import Console
from rich.progress import Progress, ProgressColumn, Task
from rich.text import Text

from registry.progress import ProgressEvent

from .format import human_bytes, human_duration

BAR_WIDTH = 18


class _OllamaColumn(ProgressColumn):
    def render(self, task: Task) -> Text:
        if task.total is None:
            return Text(task.description)
        pct = int(100 * task.completed / task.total) if task.total else 100
        filled = int(BAR_WIDTH * pct / 100)
        bar = "▕" + "█" * filled + " " * (BAR_WIDTH - filled) + "▏"
        line = f"{task.description}: {pct:3d}% {bar} "
        if task.completed >= task.total:
            return Text(line + human_bytes(task.total).rjust(6))
        speed = task.speed or 0
        eta = human_duration((task.total - task.completed) / speed) if speed else ""
        return Text(f"{line}{human_bytes(task.completed)}/{human_bytes(task.total)}"
                    f"   {human_bytes(speed)}/s   {eta}")


class ProgressRenderer:
    def __init__(self, console: Console | None = None) -> None:
        self.console = console or Console(stderr=True, highlight=False, soft_wrap=True)
        self.live = self.console.is_terminal
        self._progress = Progress(_OllamaColumn(), console=self.console) if self.live else None
        self._tasks: dict[str, int] = {}
        self._done: set[str] = set()

    def __enter__(self) -> "ProgressRenderer":
        if self._progress:
            self._progress.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._progress:
            self._progress.stop()

    def __call__(self, event: ProgressEvent) -> None:
        if self._progress:
            self._live_update(event)
        else:
            self._plain_update(event)

    def _live_update(self, ev: ProgressEvent) -> None:
        key = ev.digest or ev.status
        if key not in self._tasks:
            self._tasks[key] = self._progress.add_task(ev.status, total=ev.total)
        if ev.digest and ev.completed is not None:
            self._progress.update(self._tasks[key], completed=ev.completed)

    def _plain_update(self, ev: ProgressEvent) -> None:
        key = ev.digest or ev.status
        if key in self._done:
            return
        if ev.digest is None:
            self._done.add(key)
            self.console.print(ev.status)
        elif ev.total is not None and (ev.completed or 0) >= ev.total:
            self._done.add(key)
            self.console.print(f"{ev.status}: 100% ▕{'█' * BAR_WIDTH}▏ {human_bytes(ev.total).rjust(6)}")
