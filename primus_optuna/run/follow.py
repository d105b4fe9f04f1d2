"""Follow a training log while the job runs: each new post-warm-up iteration's tokens/s/GPU.

:class:`LogFollower` reads what was appended to the log since its last :meth:`~LogFollower.poll`, keeps an
incomplete last line for the next call, and returns the iterations not seen before, after the same warm-up rule
as :func:`~primus_optuna.run.logparse.parse_log` (iterations ``<= warmup_iters`` and the first logged one are
dropped). A line without tokens/s/GPU gets it derived from its elapsed time:
``seq_length × global_batch / (elapsed_ms / 1000) / world``. The launching runners feed these values to
``trial.report(iteration, value)`` through :attr:`~primus_optuna.run.base.RunContext.on_iteration`.

Example::

    follower = LogFollower(log_path, seq_length=8192, world_size=64, global_batch_size=128)
    for it in follower.poll():
        print(it.iteration, it.tokens_per_s_per_gpu)
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .logparse import parse_line


@dataclass(frozen=True)
class LiveIteration:
    """One steady-state iteration read from a running job's log."""

    iteration: int
    tokens_per_s_per_gpu: float
    step_time_s: float | None
    target: int | None
    """the run's last iteration when the log says ``iteration i/ N``"""


class LogFollower:
    """Incremental reader of a growing log (a file the job appends to)."""

    def __init__(
        self,
        path: str | Path,
        *,
        seq_length: int,
        world_size: int,
        global_batch_size: int,
        warmup_iters: int = 2,
    ) -> None:
        self.path = Path(path)
        self.seq_length, self.world_size, self.global_batch_size = seq_length, world_size, global_batch_size
        self.warmup_iters = warmup_iters
        self._offset = 0
        self._partial = b""
        self._seen: set[int] = set()
        self._first: int | None = None

    def poll(self) -> list[LiveIteration]:
        """The steady-state iterations logged since the previous call (each iteration once, in log order)."""
        try:
            with self.path.open("rb") as f:
                f.seek(self._offset)
                data = f.read()
        except FileNotFoundError:
            return []
        self._offset += len(data)
        lines = (self._partial + data).split(b"\n")
        self._partial = lines.pop()
        out: list[LiveIteration] = []
        for raw in lines:
            rec = parse_line(raw.decode("utf-8", "replace"))
            if rec is None or rec.iteration in self._seen:
                continue  # several ranks may print the same iteration
            self._seen.add(rec.iteration)
            if self._first is None:
                self._first = rec.iteration
            if rec.iteration == self._first or rec.iteration <= self.warmup_iters:
                continue
            gbs = rec.global_batch_size or self.global_batch_size
            tps = rec.tokens_per_s_per_gpu
            step = rec.elapsed_ms / 1000.0 if rec.elapsed_ms else None
            if tps is None and step:
                tps = self.seq_length * gbs / step / self.world_size
            if step is None and tps:
                step = self.seq_length * gbs / tps / self.world_size
            if tps:
                out.append(LiveIteration(rec.iteration, tps, step, rec.target))
        return out
