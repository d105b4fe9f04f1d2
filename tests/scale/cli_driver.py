"""``primus-optuna`` for the scale and fault tests, with one test-only tweak read from the environment.

- ``PRIMUS_TEST_KILL_AT=N``: the analytical runner SIGKILLs this process when it is asked to run trial N (a
  worker dying mid-trial, deterministically).

Everything else is the real command line.
"""

from __future__ import annotations

import os
import signal
import sys


def main() -> None:
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
