"""The GPU-hour figures of a study's account (:mod:`primus_optuna.record.account`, where each rule lives):
spent on launched jobs, and not spent thanks to the memory filter and to early stopping.

- **spent**: the ``gpu_hours`` attr of every launched trial (wall time of its job × the study's GPUs; complete,
  failed or stopped); a measured trial without it (a plain objective, an older study) counts its step time ×
  the measured steps × the GPUs;
- **saved by the memory filter**: each memory-pruned trial's estimated step time × the measured steps
  (``runner.options.train_iters``, else the default) × the GPUs (``record.report.gpu_hours_saved``): what the job
  would have cost had it run its steps; an estimate, since such a job would often have failed early instead;
- **saved by early stopping**: the ``gpu_hours_saved_early_stop`` attr of every stopped trial (its remaining
  iterations × its median step time so far × the GPUs).

Example::

    acct = gpu_hours_account(load_record("study.db"))
    acct.lines()  # ["GPU-hours: 12.30 spent on 8 launched jobs; ..."]
"""

from __future__ import annotations

from dataclasses import dataclass

from .record import StudyRecord


@dataclass(frozen=True)
class GpuHoursAccount:
    spent: float
    launched: int
    saved_memory: float
    memory_pruned: int
    saved_early_stop: float
    stopped: int

    def line(self) -> str:
        """One sentence for the run summary, the report and the dashboard note."""
        if not self.launched and not self.memory_pruned:
            return "GPU-hours: no job launched, none spent"
        if not self.launched:
            return (
                f"GPU-hours: no job launched; the memory filter pruned {self.memory_pruned} trials that would have "
                f"cost {self.saved_memory:.2f} (estimated)"
            )
        return (
            f"GPU-hours: {self.spent:.2f} spent on {self.launched} launched job{'s' * (self.launched != 1)}; "
            f"not spent: {self.saved_memory:.2f} thanks to the memory filter ({self.memory_pruned} "
            f"trial{'s' * (self.memory_pruned != 1)} pruned before launch, estimated), {self.saved_early_stop:.2f} thanks to early stopping ({self.stopped} "
            f"job{'s' * (self.stopped != 1)} stopped early)"
        )


def gpu_hours_account(rec: StudyRecord) -> GpuHoursAccount:
    """The GPU-hour figures of ``rec``'s :class:`~primus_optuna.record.account.StudyAccount` (one rule each)."""
    from ..account import study_account

    acc = study_account(rec)
    return GpuHoursAccount(
        spent=acc.gpu_hours_spent,
        launched=acc.launched,
        saved_memory=acc.gpu_hours_saved_memory,
        memory_pruned=acc.memory_pruned,
        saved_early_stop=acc.gpu_hours_saved_early_stop,
        stopped=acc.stopped_early,
    )
