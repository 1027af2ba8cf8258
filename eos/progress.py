"""A small progress bar for long CLI work (stderr, redrawn in place; plain lines when not a TTY)."""
from __future__ import annotations

import sys
import time


class ProgressBar:
    """`with ProgressBar(total, "produce") as bar: bar.advance(n)`.

    Redraws at most every `min_interval_s` so that the bar never costs more than the work.
    With total=None it shows a count and a rate instead of a percentage.
    """

    def __init__(self, total: int | None, label: str, *, unit: str = "records", stream=None,
                 min_interval_s: float = 0.1, width_chars: int = 30):
        self.total = total
        self.label = label
        self.unit = unit
        self.stream = stream or sys.stderr
        self.min_interval_s = min_interval_s
        self.width_chars = width_chars
        self.done = 0
        self._start_s = time.monotonic()
        self._last_draw_s = 0.0
        self._tty = hasattr(self.stream, "isatty") and self.stream.isatty()
        self._last_percent_printed = -1

    def advance(self, count: int = 1) -> None:
        self.done += count
        now_s = time.monotonic()
        if now_s - self._last_draw_s >= self.min_interval_s:
            self._draw(now_s)

    def _draw(self, now_s: float, final: bool = False) -> None:
        self._last_draw_s = now_s
        elapsed_s = max(now_s - self._start_s, 1e-9)
        rate = self.done / elapsed_s
        if self.total:
            fraction = min(self.done / self.total, 1.0)
            filled = int(fraction * self.width_chars)
            bar = "#" * filled + "-" * (self.width_chars - filled)
            text = f"{self.label} [{bar}] {fraction * 100:5.1f}% {self.done}/{self.total} {self.unit} ({rate:,.0f}/s)"
            percent = int(fraction * 100)
        else:
            text = f"{self.label} {self.done} {self.unit} ({rate:,.0f}/s)"
            percent = self.done
        if self._tty:
            self.stream.write("\r" + text + ("\n" if final else ""))
            self.stream.flush()
        elif final or (self.total and percent // 10 > self._last_percent_printed // 10):
            # Not a terminal (CI logs, pipes): a line every 10% instead of a redraw.
            self._last_percent_printed = percent
            self.stream.write(text + "\n")
            self.stream.flush()

    def close(self) -> None:
        self._draw(time.monotonic(), final=True)

    def __enter__(self) -> "ProgressBar":
        return self

    def __exit__(self, *exc) -> None:
        self.close()
