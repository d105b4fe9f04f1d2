"""``report``, ``dashboard`` and ``export``: what a study leaves behind, from its storage alone."""

from __future__ import annotations

import sys
from pathlib import Path

import click

from ..errors import SpecError
from ._common import user_errors

storage_option = click.option(
    "--storage",
    "storage",
    required=True,
    metavar="URL",
    help="Optuna storage URL (sqlite:///NAME.db, postgresql://..., or a .db/.log path).",
)
study_name_option = click.option(
    "--study-name",
    "study_name",
    default=None,
    metavar="NAME",
    help="Study in the storage (optional when the storage holds exactly one).",
)


def _url(storage: str) -> str:
    from ..record.storage import normalize_url

    return normalize_url(storage)


def _check_file(url: str) -> None:
    """A SQLite/journal storage that does not exist is a user error (Optuna would create an empty one)."""
    from ..errors import SpecError
    from ..record.storage import storage_file

    f = storage_file(url)
    if f is not None and not f.is_file():
        raise SpecError(f"--storage {url!r}: no such file {str(f)!r}; pass the storage that `run` used")


def _study(storage: str, study_name: str | None):  # -> optuna.Study
    import optuna

    from ..errors import SpecError
    from ..record.storage import make_storage
    from ._common import check_storage_url

    check_storage_url(storage)
    url = _url(storage)
    _check_file(url)
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    backend = make_storage(url, heartbeat_interval=None)
    names = optuna.get_all_study_names(backend)
    if not names:
        raise SpecError(
            f"--storage {url}: it holds no study; `primus-optuna run STUDY --storage {url}` creates one"
        )
    if study_name is None:
        if len(names) != 1:
            raise SpecError(
                f"--study-name is required: {url} holds {len(names)} studies"
                + (f" ({', '.join(names)})" if names else "")
            )
        study_name = names[0]
    if study_name not in names:
        raise SpecError(
            f"--study-name {study_name!r}: no such study in {url}"
            + (f"; it holds {', '.join(names)}" if names else "; it holds no study")
        )
    return optuna.load_study(study_name=study_name, storage=backend), url


@click.command()
@storage_option
@study_name_option
@click.option("--out", "out", default=None, type=click.Path(file_okay=False), help="Output folder.")
@user_errors
def report(storage: str, study_name: str | None, out: str | None) -> None:
    """Write the audit report (report.md, self-contained report.html) of a study, finished or not."""
    from ..record.report import build_report, default_report_dir

    study, url = _study(storage, study_name)
    folder = out or default_report_dir(study.study_name, url)
    try:
        paths = build_report(url, study.study_name, folder)
    except OSError as exc:
        raise SpecError(
            f"--out {str(folder)!r}: cannot write the report there ({exc.strerror or exc}); pass a folder you "
            "can write to"
        ) from None
    click.echo(f"wrote {paths['md'].resolve()}")
    click.echo(f"wrote {paths['html'].resolve()}")


@click.command()
@click.option(
    "--storage", "storage", default=None, metavar="URL", help="Storage URL (default: the only *.db here)."
)
@click.option("--host", default="127.0.0.1", show_default=True)
@click.option("--port", default=8080, show_default=True, type=int)
@click.option(
    "--artifact-dir",
    "artifact_dir",
    default=None,
    type=click.Path(file_okay=False),
    help="File artifact store (default: <storage stem>-artifacts next to the storage file).",
)
@user_errors
def dashboard(storage: str | None, host: str, port: int, artifact_dir: str | None) -> None:
    """Start optuna-dashboard on a study storage, with its artifact store (logs, transcripts, profiles)."""
    from ..errors import SpecError
    from ..record.dashboard import artifact_dir_for, serve_dashboard

    if storage is None:
        dbs = sorted(Path.cwd().glob("*.db"))
        if len(dbs) != 1:
            raise SpecError(
                f"--storage is required: found {len(dbs)} *.db files here"
                + (f" ({', '.join(p.name for p in dbs)})" if dbs else "")
            )
        storage = str(dbs[0])
    url = _url(storage)
    _check_file(url)
    adir = Path(artifact_dir) if artifact_dir else artifact_dir_for(url)
    _check_port(host, port)
    click.echo(
        f"optuna-dashboard on http://{host}:{port}/dashboard (storage {url}, artifacts {adir})", err=True
    )
    try:
        serve_dashboard(url, host=host, port=port, artifact_dir=adir)
    except OSError as exc:  # taken between the check and the server's bind
        raise SpecError(f"--port {port}: cannot listen on {host}:{port} ({exc.strerror or exc})") from None


def _check_port(host: str, port: int) -> None:
    """One error when ``host:port`` cannot be listened on (in use, or not an address of this machine)."""
    import socket

    try:
        with socket.create_server((host, port)):
            pass
    except OSError as exc:
        hint = "; pick a free one with --port" if exc.errno in (98, 48, 10048) else ""  # EADDRINUSE
        why = (exc.strerror or str(exc)).split(" (while attempting", 1)[0]
        raise SpecError(f"--port {port}: cannot listen on {host}:{port} ({why}){hint}") from None


@click.command()
@storage_option
@study_name_option
@click.option(
    "--format",
    "fmt",
    type=click.Choice(["primus", "megatron", "env", "json", "torchtitan", "primus-torchtitan"]),
    default=None,
    help="Primus overlay YAML, Megatron arguments, `export` lines, JSON, TorchTitan 0.3 arguments, or a Primus "
    "TorchTitan-backend experiment [default: "
    "torchtitan for a TorchTitan study, else one the study's GPUs run: primus on AMD GPUs, megatron elsewhere].",
)
@click.option(
    "--upstream",
    is_flag=True,
    help="With --format megatron: leave out the Primus-only flags (zero bubble, Primus-Turbo) for upstream Megatron-LM.",
)
@click.option("--trial", "trial_number", type=int, default=None, help="Trial number (default: the best).")
@click.option(
    "--output", "-o", "output", default=None, type=click.Path(dir_okay=False), help="Write to a file."
)
@user_errors
def export(
    storage: str,
    study_name: str | None,
    fmt: str | None,
    upstream: bool,
    trial_number: int | None,
    output: str | None,
) -> None:
    """Print the best (or chosen) trial's configuration in the format a launcher reads."""
    from ..record.export import export_config, select_trial, study_spec, trial_config
    from ..record.summary import suggested_export
    from ._common import check_output_path, trial_value_text

    if output:
        check_output_path(output, "--output")
    study, url = _study(storage, study_name)
    spec = study_spec(study)
    fmt = fmt or suggested_export(spec)
    trial = select_trial(study, trial_number)
    config = trial_config(trial, spec)
    value = f", {trial_value_text(trial)}" if trial.values else f" ({trial.state.name})"
    header = f"primus-optuna study {study.study_name}, trial {trial.number}{value}: {config.key()}"
    from ..run.base import value_kind

    if trial.values and value_kind(trial.user_attrs.get("source")) == "estimated":  # with its uncertainty
        from ..record.report import record_of
        from ..record.summary import estimates_band

        band = estimates_band(record_of(study, url))
        header += f"\nerror band of the estimate: {band.text()} ({band.source})"
    extra = {"study": study.study_name, "trial": trial.number, "values": trial.values}
    text = export_config(spec, config, fmt, header=header, extra=extra, upstream=upstream)
    if trial.state.name != "COMPLETE":
        reason = trial.user_attrs.get("prune_reason") or trial.user_attrs.get("failure_reason") or ""
        click.echo(
            f"warning: trial {trial.number} is {trial.state.name.lower()}"
            + (f" ({reason})" if reason else "")
            + "; it never ran to completion",
            err=True,
        )
    if output:
        try:
            Path(output).write_text(text)
        except OSError as exc:
            raise SpecError(f"--output {output!r}: cannot write it ({exc.strerror or exc})") from None
        click.echo(f"wrote {output}", err=True)
    else:
        sys.stdout.write(text)
