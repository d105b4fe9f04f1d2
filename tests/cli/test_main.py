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


EARLY_CTRL_C = """
import sys
from primus_optuna import cli as c

def interrupted(self, ctx, name):
    raise KeyboardInterrupt  # Ctrl-C while click resolves the command, before any command handles signals

c.LazyGroup.get_command = interrupted
from primus_optuna.cli import main
main(sys.argv[1:])
"""


def test_main_exits_with_the_codes_of_the_program():
    """An early Ctrl-C exits 130 (SIGINT's code, as an interrupted run does; click's standalone mode would say
    "Aborted!" and exit 1), a usage error 2, --version 0."""

    def code(script: str, *args: str) -> tuple[int, str]:
        r = subprocess.run([sys.executable, "-c", script, *args], capture_output=True, text=True, timeout=120)
        return r.returncode, r.stderr

    rc, err = code(EARLY_CTRL_C, "space", "x.yaml")
    assert rc == 130 and "Aborted" not in err and "Traceback" not in err, err
    plain = "import sys; from primus_optuna.cli import main; main(sys.argv[1:])"
    assert code(plain, "no-such-command")[0] == 2
    assert code(plain, "--version")[0] == 0


EARLY_TERM = """
import os, signal, sys
from primus_optuna import cli as c

def terminated(self, ctx, name):
    os.kill(os.getpid(), signal.SIGTERM)  # SIGTERM before any command handles signals

c.LazyGroup.get_command = terminated
c.main(sys.argv[1:])
"""

SIGNALS_DURING_IMPORT = """
import signal
import primus_optuna.cli as c
assert signal.getsignal(signal.SIGINT) is signal.default_int_handler, "an importer's SIGINT handling is kept"
c._quiet_exit(signal.SIGINT, None)
"""


def test_a_signal_while_the_program_starts_exits_with_its_code():
    """SIGTERM before a command handles signals exits 143 (not a kill by the signal, -15); the handlers the
    command line installs while it imports are removed once imported, and exit with the signal's code."""
    r = subprocess.run([sys.executable, "-c", EARLY_TERM, "space", "x.yaml"], capture_output=True, text=True)
    assert r.returncode == 143 and "Traceback" not in r.stderr, r.stderr
    r = subprocess.run([sys.executable, "-c", SIGNALS_DURING_IMPORT], capture_output=True, text=True)
    assert r.returncode == 130 and not r.stderr, r.stderr


def test_a_usage_error_is_one_error_line_with_exit_2():
    """A mistyped option or a value out of range reads as every other user error: one ``error:`` line naming
    the command's help, exit 2 (click's own form is three lines: Usage, Try, Error)."""
    out = subprocess.run(
        [
            sys.executable,
            "-c",
            "from primus_optuna.cli import main; main(['run', 'x.yaml', '--n-trial', '3'])",
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert out.returncode == 2, out.stderr
    assert out.stderr == (
        "error: No such option '--n-trial'. Did you mean '--n-trials'? (see `primus-optuna run --help`)\n"
    )
