"""Progress of long work, as the command line shows it: on a terminal a bar redrawn in place, elsewhere (a log
file, a pipe) a line now and then. The library itself only calls back (an estimator's ``callback``, the
ingest functions' ``progress``) and prints nothing; the surfaces (CLI, pipeline, reports) own the display."""

from __future__ import annotations

import sys
import time

LOG_SECONDS = 10.0  # off a terminal: a line at least this often ...
LOG_STEPS = 10  # ... and at every tenth of the work
REDRAW_SECONDS = 0.1  # on a terminal: the bar redrawn at most this often
BAR_WIDTH = 24


def duration(seconds: float) -> str:
    """``42 s``, ``4 min 10 s``, ``2 h 5 min``."""
    seconds = int(round(seconds))
    if seconds < 60:
        return f"{seconds} s"
    if seconds < 3600:
        return f"{seconds // 60} min" + (f" {seconds % 60} s" if seconds < 600 and seconds % 60 else "")
    return f"{seconds // 3600} h {seconds % 3600 // 60} min"


def amount(value: float, unit: str) -> str:
    """A count, or bytes in MB / GB."""
    if unit != "B":
        return f"{value:,.0f}"
    return f"{value / 1e9:.2f} GB" if value >= 1e9 else f"{value / 1e6:.1f} MB"


class Progress:
    """Progress of ``total`` units of work, reported by :meth:`update` with the amount done so far.

    Parameters
    ----------
    total : number or None
        The work (None: unknown, no percentage or ETA); ``update`` may change it.
    what : str
        What is counted (``"iteration"``, ``"rank"``, ``"read"``).
    unit : str
        The rate's unit (``"it"``, ``"B"`` for bytes).
    at_most : bool
        ``total`` is an upper bound (a fit's ``max_iter``, which its stopping rule may cut short): the ETA says
        "at most".
    stream : file or None
        Where to write (default: stderr); a bar when it is a terminal, else lines.
    emit : callable or None
        Off a terminal, ``emit(line, fields)`` instead of writing the line (a pipeline's structured log), with
        ``fields`` the figures (done, total, rate, eta_seconds).
    shown : bool
        False: show nothing (a command's ``--no-progress``).

    The rate is measured from the first update (or from the start if there was one update only), so that
    start-up does not count as work; an amount done that goes back (a new phase of a fit, or a fit rerun after a
    lost worker) starts the measure again.
    """

    def __init__(self, total=None, what: str = "iteration", unit: str = "it", *, at_most: bool = False,
                 stream=None, emit=None, shown: bool = True):
        self.total, self.what, self.unit, self.at_most, self.emit = total, what, unit, at_most, emit
        self.shown = shown
        self.stream = stream if stream is not None else sys.stderr
        self.terminal = emit is None and is_terminal(self.stream)
        self.started = time.perf_counter()
        self.first = None  # (time, done) of the first update since the measure (re)started
        self.done, self.note = 0, ""
        self.shown_at, self.shown_step, self.drawn = -float("inf"), -1, False

    # ------------------------------------------------------------------ reporting
    def update(self, done, note: str = "", total=None) -> None:
        """``done`` units of ``total`` (if given, else the last total) are done; ``note``: what else to show
        (the objective)."""
        if not self.shown:
            return
        now = time.perf_counter()
        if total is not None:
            self.total = total
        if self.first is None or done < self.done:
            if self.first is not None:  # gone back: the measure starts again
                self.started, self.shown_step = now, -1
            self.first = (now, done)
        self.done, self.note = done, note
        if self.terminal:
            if now - self.shown_at >= REDRAW_SECONDS or done == self.total:
                self._draw(now)
            return
        step = int(min(done, self.total) * LOG_STEPS // self.total) if self.total else -1
        if now - self.shown_at >= LOG_SECONDS or step > self.shown_step:
            self.shown_step = step
            self._line(now)

    def iteration(self, info) -> None:
        """An estimator's callback: ``info`` is the engine's ``IterationInfo``."""
        self.update(info.iteration, f"objective {info.objective:.6g}", total=info.max_iter)

    def close(self, note: str = "") -> None:
        """The work ended (complete or not): a last line with the time taken; ``note`` says how it ended."""
        if not self.shown:
            return
        now = time.perf_counter()
        if self.terminal and self.drawn:
            self._draw(now)
            self.stream.write("\n")
        text = f"{self.what} {self._count()} in {duration(now - self.started)}"
        rate = self.rate(now)
        text += f" ({self._rate_text(rate)})" if rate else ""
        text += "".join(f", {part}" for part in (self.note, note) if part)
        self._write(text, now, rate)

    # ------------------------------------------------------------------ figures
    def fraction(self):
        return None if not self.total else min(self.done / self.total, 1.0)

    def rate(self, now: float):
        """Units per second since the first update (since the start when only one came)."""
        if self.first is None:
            return None
        since, base = self.first
        if self.done == base:
            since, base = self.started, 0
        seconds = now - since
        return (self.done - base) / seconds if seconds > 0 and self.done > base else None

    def eta(self, now: float):
        rate = self.rate(now)
        return None if rate is None or not self.total else max(self.total - self.done, 0) / rate

    # ------------------------------------------------------------------ text
    def _count(self) -> str:
        done = amount(self.done, self.unit)
        return done if not self.total else f"{done}/{amount(self.total, self.unit)}"

    def _rate_text(self, rate) -> str:
        if self.unit == "B":
            return f"{amount(rate, self.unit)}/s"
        return f"{rate:,.0f} {self.unit}/s" if rate >= 100 else f"{rate:.3g} {self.unit}/s"  # 1,670 not 1.67e+03

    def _figures(self, now: float) -> tuple[list[str], float | None, float | None]:
        rate, eta = self.rate(now), self.eta(now)
        parts = [] if rate is None else [self._rate_text(rate)]
        parts += [self.note] if self.note else []
        if eta is not None:
            parts.append(f"ETA {'at most ' if self.at_most else ''}{duration(eta)}")
        return parts, rate, eta

    def _line(self, now: float) -> None:
        parts, rate, eta = self._figures(now)
        fraction = self.fraction()
        head = f"{self.what} {self._count()}" + ("" if fraction is None else f" ({fraction:.0%})")
        self._write(", ".join([head, *parts]), now, rate, eta)

    def _write(self, text: str, now: float, rate=None, eta=None) -> None:
        self.shown_at = now
        if self.emit is not None:
            self.emit(text, {"done": self.done, "total": self.total, "rate": rate,
                             "eta_seconds": None if eta is None else round(eta, 1)})
        else:
            print(text, file=self.stream, flush=True)

    def _draw(self, now: float) -> None:
        parts, _, _ = self._figures(now)
        fraction = self.fraction()
        if fraction is None:
            bar = ""
        else:
            filled = int(fraction * BAR_WIDTH)
            bar = f"|{'#' * filled}{'.' * (BAR_WIDTH - filled)}| {fraction:4.0%} "
        self.stream.write(f"\r{self.what} {bar}{self._count()}" + "".join(f"  {p}" for p in parts) + "\x1b[K")
        self.stream.flush()
        self.shown_at, self.drawn = now, True


def is_terminal(stream) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def show_iterations(model, what: str = "iteration", **options):
    """A :class:`Progress` of ``model``'s iterations, set as its callback; None if the estimator takes no
    callback. Its total is ``max_iter``, an upper bound (the stopping rule may end the fit before)."""
    if "callback" not in model.get_params(deep=False):
        return None
    progress = Progress(getattr(model, "max_iter", None), what, "it", at_most=True, **options)
    model.set_params(callback=progress.iteration)
    return progress
