"""A study worker run as a subprocess by the resume / multi-process tests.

    python worker.py STUDY.yaml STORAGE_URL N_TRIALS KILL_AT_RUN

KILL_AT_RUN > 0 makes the process SIGKILL itself inside its KILL_AT_RUN-th runner call (a trial left RUNNING);
only then is the storage heartbeat on (1 s), so the next run fails and retries that trial.
"""

from __future__ import annotations

import os
import signal
import sys

import optuna

from primus_optuna import StudySpec
from primus_optuna.record.storage import open_study
from primus_optuna.run.analytical import AnalyticalRunner
from primus_optuna.run.base import RunFailure
from primus_optuna.run.objective import make_objective
from primus_optuna.search.pruner import MemoryPrefilterPruner
from primus_optuna.search.sampler import PrimusSampler


class KillingRunner(AnalyticalRunner):
    def __init__(self, spec: StudySpec, kill_at: int) -> None:
        super().__init__(spec)
        self.kill_at, self.calls = kill_at, 0

    def run(self, config, context):  # type: ignore[no-untyped-def]
        self.calls += 1
        if self.calls == self.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)
        return super().run(config, context)


def main() -> None:
    study_path, url, n, kill_at = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = StudySpec.from_yaml(study_path)
    # a 1 s heartbeat with a 1 s grace period fails a live trial that runs over a second (SQLite's clock has
    # whole seconds), and its retry repeats the decision: only the kill test, with one worker, wants it
    beat = {"heartbeat_interval": 1, "grace_period": 1} if kill_at > 0 else {"heartbeat_interval": None}
    handle = open_study(spec, storage=url, pruner=MemoryPrefilterPruner(), **beat)
    handle.study.sampler = PrimusSampler(spec)
    objective = make_objective(spec, KillingRunner(spec, kill_at), runs_dir=handle.runs_dir)
    handle.study.optimize(objective, n_trials=n, catch=(RunFailure,))


if __name__ == "__main__":
    main()
