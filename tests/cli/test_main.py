"""The program's entry point (primus_optuna.cli.main) against the click group used in-process."""

import signal
import subprocess
import sys

from click.testing import CliRunner

from primus_optuna.cli import cli

PROBE = """
import signal
from primus_optuna.cli import main
try:
    main(["--version"])
except SystemExit:
    pass
print(signal.getsignal(signal.SIGINT) is signal.SIG_IGN, signal.getsignal(signal.SIGTERM) is signal.SIG_IGN)
"""


def test_main_ignores_late_signals_once_the_command_has_returned():
    out = subprocess.run(
        [sys.executable, "-c", PROBE], capture_output=True, text=True, timeout=120, check=True
    )
    assert out.stdout.split()[-2:] == ["True", "True"], out.stdout + out.stderr


def test_in_process_invocation_leaves_the_handlers_alone():
    """A process calling the commands (tests, a notebook) keeps its handlers: an ignored SIGTERM would be
    inherited by every job it launches later."""

    def mine(signum, frame):  # pragma: no cover - never called
        pass

    saved = {s: signal.signal(s, mine) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        r = CliRunner().invoke(cli, ["--version"])
        assert r.exit_code == 0, r.output
        assert signal.getsignal(signal.SIGINT) is mine and signal.getsignal(signal.SIGTERM) is mine
    finally:
        for s, h in saved.items():
            signal.signal(s, h)
