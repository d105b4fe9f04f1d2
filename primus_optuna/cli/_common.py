"""Helpers shared by the subcommands: loading a study, parsing ``--config``, printing, error handling."""

from __future__ import annotations

import atexit
import functools
import gc
import json
import signal
import sys
from collections.abc import Callable
from typing import Any, TypeVar

import click

from ..errors import SpecError
from ..space import Space, TrainingConfig, parse_config_string
from ..spec import StudySpec

F = TypeVar("F", bound=Callable[..., Any])

study_argument = click.argument("study", type=click.Path(dir_okay=False))
json_option = click.option("--json", "as_json", is_flag=True, help="Print machine-readable JSON.")
config_option = click.option(
    "--config",
    "config_text",
    default="",
    metavar="KEY=VALUE,...",
    help="Axes to set, e.g. tp=1,pp=4,vpp=2,ep=8,mbs=2; missing axes come from the study's baseline.",
)


def seconds_option(name: str, help: str) -> Callable[[F], F]:
    """A duration flag: a positive number of seconds, unset (``None``) by default."""
    return click.option(
        name, type=click.FloatRange(min=0, min_open=True), default=None, metavar="SECONDS", help=help
    )


def user_errors(fn: F) -> F:
    """Turn :class:`SpecError` into one message on stderr and exit code 2, an interrupt into one line and 128 +
    its signal."""

    @functools.wraps(fn)
    def wrapper(*args: Any, **kwargs: Any) -> Any:
        try:
            return fn(*args, **kwargs)
        except SpecError as exc:
            click.echo(f"error: {exc}", err=True)
            sys.exit(2)
        except KeyboardInterrupt as exc:
            # Ctrl-C outside a command's own handling (click's would be "Aborted!", exit 1); an Interrupted
            # names its signal (SIGTERM too)
            signum = getattr(exc, "signum", signal.SIGINT)
            click.echo(f"interrupted ({signal.Signals(signum).name}); run the same command again", err=True)
            sys.exit(128 + int(signum))

    return wrapper  # type: ignore[return-value]


def skip_exit_collection() -> None:
    """Spare the interpreter's shutdown its garbage-collector passes over every live object (0.1 s after a
    ``plan`` of a large space: tens of thousands of configurations and memoised terms): at exit, whatever is
    alive moves to the permanent generation (:func:`gc.freeze`) first. For commands whose output is on
    stdout only (flushed at exit regardless) and that leave nothing that needs a finaliser."""
    atexit.register(gc.freeze)


def load_study(path: str) -> tuple[StudySpec, Space]:
    spec = StudySpec.from_yaml(path)
    for line in spec.cluster.warnings():
        click.echo(f"warning: {line}", err=True)
    return spec, Space(spec)


def config_from_option(space: Space, text: str) -> TrainingConfig:
    """The baseline with the ``--config`` axes applied, derived (not canonicalised)."""
    return space.make(**parse_config_string(text))


def trial_value_text(trial: Any) -> str:
    """``1234.5 tokens/s/GPU (estimated)`` for a trial with a value, its kind
    (:func:`~primus_optuna.run.base.value_kind`) beside it, so an estimate is never read as a measurement;
    ``""`` without a value."""
    if not trial.values:
        return ""
    from ..run.base import value_kind

    kind = value_kind(trial.user_attrs.get("source"))
    return f"{trial.values[0]:.1f} tokens/s/GPU" + (f" ({kind})" if kind else "")


def emit_json(data: Any) -> None:
    click.echo(json.dumps(data, indent=2, sort_keys=False, default=str))


def program() -> str:
    """How to call this CLI again from a new shell: ``primus-optuna`` when that name on the ``PATH`` of a
    fresh login is this program (installed outside a virtual environment), else the absolute path of the
    executable that is running (e.g. ``/home/me/primus-optuna/.venv/bin/primus-optuna``)."""
    import shlex
    import shutil
    from pathlib import Path

    exe = Path(sys.argv[0]) if sys.argv and sys.argv[0] else None
    if exe is None or exe.name != "primus-optuna":  # imported (tests, python -m): the plain name
        return "primus-optuna"
    exe = Path(shutil.which(str(exe)) or exe).resolve()
    in_venv = sys.prefix != sys.base_prefix
    on_path = shutil.which("primus-optuna")
    if not in_venv and on_path and Path(on_path).resolve() == exe:
        return "primus-optuna"
    return shlex.quote(str(exe))


def check_storage_url(url: str, option: str = "--storage") -> None:
    """Refuse a storage URL that would silently write somewhere else: a SQLite URL without its three
    slashes (``sqlite:/x.db`` makes a folder ``sqlite:``) and a file storage whose folder does not exist
    (a typo would otherwise create it)."""
    from ..record.storage import normalize_url, storage_file

    normalized = normalize_url(url)
    if url.startswith("sqlite:") and not url.startswith("sqlite:///"):
        raise SpecError(
            f"{option} {url!r}: a SQLite URL has three slashes before the path: sqlite:///relative/x.db or "
            "sqlite:////absolute/x.db"
        )
    f = storage_file(normalized)
    if f is not None and not f.parent.is_dir():
        raise SpecError(
            f"{option} {url!r}: the folder {str(f.parent)!r} does not exist; create it "
            f"(mkdir -p {shlex_quote(str(f.parent))}) or pass another path"
        )


def check_output_path(path: str, option: str) -> None:
    """An output file's folder must exist (a typo would otherwise create a new folder)."""
    from pathlib import Path

    parent = Path(path).parent
    if not parent.is_dir():
        raise SpecError(
            f"{option} {path!r}: the folder {str(parent)!r} does not exist; create it "
            f"(mkdir -p {shlex_quote(str(parent))}) or pass another path"
        )


def shlex_quote(text: str) -> str:
    import shlex

    return shlex.quote(text)
