"""The GPU-hour account of a study: spent on launched jobs, and not spent thanks to the memory filter and to
early stopping.

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

from .analysis import gpu_hours_saved, memory_pruned
from .record import StudyRecord, as_number


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
            f"slow job{'s' * (self.stopped != 1)} stopped)"
        )


def gpu_hours_account(rec: StudyRecord) -> GpuHoursAccount:
    """The account of ``rec`` (see the module docstring for each figure's rule)."""
    spent = [float(h) for t in rec.trials if (h := t.attr("gpu_hours")) is not None]
    for (
        t
    ) in rec.trials:  # a measured trial recorded without its wall time (a plain objective, an older study)
        if (
            t.attr("gpu_hours") is None
            and t.state in ("COMPLETE", "FAIL")
            and t.attr("source") not in (None, "analytical")
            and (st := as_number(t.attr("step_time_s")))
        ):
            spent.append(st * rec.measure_steps * rec.spec.world / 3600.0)
    stopped = [t for t in rec.trials if str(t.attr("prune_reason") or "").startswith("slow")]
    saved_mem, _ = gpu_hours_saved(rec)
    return GpuHoursAccount(
        spent=sum(spent),
        launched=len(spent),
        saved_memory=saved_mem,
        memory_pruned=len(memory_pruned(rec)),
        saved_early_stop=sum(float(t.attr("gpu_hours_saved_early_stop") or 0.0) for t in stopped),
        stopped=len(stopped),
    )
