"""The ``primus-optuna`` command line: a thin layer over the library (options in, library calls, text or JSON
out). Every user error ends as one message on stderr and exit code 2.

May import any layer; nothing in the library imports it. Subcommands are imported lazily (``LazyGroup``) so
``primus-optuna space`` never pays for Optuna, DSPy or torch.
"""

from __future__ import annotations

import signal
import sys
import threading


def _quiet_exit(signum: int, frame: object) -> None:
    """A Ctrl-C or SIGTERM while the command line is being imported: the signal's exit code, no traceback."""
    sys.exit(128 + signum)


_BEFORE: dict[int, object] = {}
if threading.current_thread() is threading.main_thread():
    for _s in (signal.SIGINT, signal.SIGTERM):
        _BEFORE[_s] = signal.signal(_s, _quiet_exit)

import importlib  # noqa: E402  (after the handlers: these imports take most of the start-up)
from typing import Any  # noqa: E402

import click  # noqa: E402

# name -> "module:attribute" (relative to primus_optuna.cli)
COMMANDS: dict[str, str] = {
    "space": "space_cmd:space",
    "check": "space_cmd:check",
    "estimate": "estimate_cmd:estimate",
    "plan": "plan_cmd:plan",
    "capacity": "capacity_cmd:capacity",
    "run": "run_cmd:run",
    "report": "report_cmd:report",
    "dashboard": "report_cmd:dashboard",
    "export": "report_cmd:export",
    "calibrate": "calibrate_cmd:calibrate",
}


class LazyGroup(click.Group):
    def list_commands(self, ctx: click.Context) -> list[str]:
        return list(COMMANDS)

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        target = COMMANDS.get(cmd_name)
        if target is None:
            return None
        module, attr = target.split(":")
        return getattr(importlib.import_module(f"{__name__}.{module}"), attr)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(package_name="primus-optuna")
def cli() -> None:
    """Find the fastest distributed-training configuration for an LLM on a GPU cluster (an Optuna study)."""


_NO_ARGS_IS_HELP: Any = getattr(click.exceptions, "NoArgsIsHelpError", ())
"""click's "a bare group/command prints its help" (click >= 8.2)"""


def main(argv: list[str] | None = None) -> Any:
    """The program's entry point (the console script): the command, then the process's exit (a Ctrl-C before
    the command handles signals: 130, SIGINT's code, 143 for SIGTERM; a usage error: 2). From the moment
    the command has returned, SIGINT and SIGTERM are ignored, so that a late Ctrl-C (one sent after an
    interrupted ``run`` has written its summary) cannot turn the exit into a traceback and another code. For a
    process that is about to end only: in-process callers use :data:`cli` (its handlers are left alone)."""
    if threading.current_thread() is threading.main_thread():
        # until a command installs its own (SIGINT: click's Abort below)
        signal.signal(signal.SIGTERM, _quiet_exit)
    try:
        try:
            rv = cli.main(args=argv, prog_name="primus-optuna", standalone_mode=False)
        except click.exceptions.Abort:
            # a Ctrl-C before the command installed its own handling (click's standalone mode would print
            # "Aborted!" and exit 1): the exit code of SIGINT, as a run interrupted later has
            sys.exit(128 + signal.SIGINT)
        except click.UsageError as exc:  # one `error:` line, as every other user error (click: three lines)
            if isinstance(exc, _NO_ARGS_IS_HELP):  # a bare command: its help, as click prints it
                exc.show()
                sys.exit(exc.exit_code)
            where = exc.ctx.command_path if exc.ctx else "primus-optuna"
            click.echo(f"error: {exc.format_message().rstrip('.')} (see `{where} --help`)", err=True)
            sys.exit(exc.exit_code)
        except click.ClickException as exc:
            exc.show()
            sys.exit(exc.exit_code)
        sys.exit(rv if isinstance(rv, int) else 0)
    finally:
        if threading.current_thread() is threading.main_thread():
            for s in (signal.SIGINT, signal.SIGTERM):
                signal.signal(s, signal.SIG_IGN)


for _s, _handler in _BEFORE.items():  # in-process importers keep their own handling
    signal.signal(_s, _handler)  # type: ignore[arg-type]
