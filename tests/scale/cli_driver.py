"""``primus-optuna`` for the scale and fault tests, with two test-only tweaks read from the environment.

- ``PRIMUS_TEST_HEARTBEAT=S``: heartbeat every S seconds with a 2·S grace period, for every runner kind (the
  CLI uses 30 s / 90 s for launching runners and none for the analytical one) — so a killed worker's trial is
  failed and retried within seconds.
- ``PRIMUS_TEST_KILL_AT=N``: the analytical runner SIGKILLs this process when it is asked to run trial N (a
  worker dying mid-trial, deterministically).

Everything else is the real command line.
"""

from __future__ import annotations

import os
import signal
import sys


def main() -> None:
    heartbeat = os.environ.get("PRIMUS_TEST_HEARTBEAT")
    if heartbeat:
        from primus_optuna.cli import run_cmd
        from primus_optuna.record import storage

        secs = int(heartbeat)
        storage.HEARTBEAT_INTERVAL_S = secs
        storage.open_study.__kwdefaults__["grace_period"] = 2 * secs
        original = storage.open_study

        def open_study(*args, **kwargs):  # type: ignore[no-untyped-def]
            kwargs["heartbeat_interval"] = secs  # also for the analytical runner
            return original(*args, **kwargs)

        storage.open_study = open_study
        assert run_cmd  # imported so the CLI module is loaded before the patch is used
    kill_at = os.environ.get("PRIMUS_TEST_KILL_AT")
    if kill_at:
        from primus_optuna.run.analytical import AnalyticalRunner

        run = AnalyticalRunner.run

        def killing_run(self, config, context):  # type: ignore[no-untyped-def]
            if context.trial_number == int(kill_at):
                os.kill(os.getpid(), signal.SIGKILL)
            return run(self, config, context)

        AnalyticalRunner.run = killing_run  # type: ignore[method-assign]
    from primus_optuna.cli import main as cli_main

    sys.exit(cli_main(sys.argv[1:]))


if __name__ == "__main__":
    main()
