"""``calibrate``: measure this node with the installed torch and write its hardware profile (a YAML file that a
study names in ``cluster.profile``)."""

from __future__ import annotations

import sys
import time

import click

from ..errors import SpecError
from ._common import check_output_path, user_errors


class _Progress:
    """The section being measured and the budget spent: a tqdm bar on a terminal (Optuna's progress style), one
    line per section otherwise; nothing with ``--no-progress``."""

    def __init__(self, budget_s: float, enabled: bool) -> None:
        self.enabled = enabled
        self.bar = None
        self.section = ""
        if enabled and sys.stderr.isatty():
            from tqdm.auto import tqdm

            self.bar = tqdm(total=100, desc="calibrate", unit="%", file=sys.stderr, leave=False)
        self.t0 = time.perf_counter()

    def __call__(self, section: str, fraction: float) -> None:
        if not self.enabled or section == self.section:
            return
        self.section = section
        pct = min(100, round(100 * fraction))
        if self.bar is not None:
            self.bar.set_description(f"calibrate: {section}")
            self.bar.update(max(0, pct - self.bar.n))
        else:
            click.echo(f"calibrate: {section} ({time.perf_counter() - self.t0:.0f} s)", err=True)

    def close(self) -> None:
        if self.bar is not None:
            self.bar.close()


@click.command()
@click.option(
    "--device", type=click.Choice(["cuda", "cpu"]), default="cuda", show_default=True, help="What to measure."
)
@click.option(
    "--out",
    "out",
    default=None,
    type=click.Path(dir_okay=False),
    help="The profile to write (YAML), or with --network the network CSV (default network.csv); written whole "
    "or not at all.",
)
@click.option(
    "--budget-s",
    type=click.FloatRange(min=0, min_open=True),
    default=None,
    metavar="SECONDS",
    help="Time to spend measuring (default 300; --network: 120); process start-up comes on top.",
)
@click.option(
    "--study",
    type=click.Path(dir_okay=False),
    default=None,
    help="Measure the GEMM, grouped-GEMM and attention shapes of this study (default: a grid for the device); "
    "with --network, launch across its cluster through its runner (Slurm or runner.options.hosts).",
)
@click.option(
    "--network",
    is_flag=True,
    help="Measure the collectives between the cluster's nodes and write the CSV that cluster.network reads.",
)
@click.option(
    "--local-ranks",
    type=int,
    default=None,
    metavar="N",
    help="With --network: N processes on this machine, each a node of 1 rank (gloo on --device cpu).",
)
@click.option(
    "--devices",
    type=click.IntRange(min=1),
    default=None,
    help="GPUs to run the collectives among (default: all); CPU: processes (default 2).",
)
@click.option("--no-progress", is_flag=True, help="Hide the progress bar.")
@user_errors
def calibrate(
    device: str,
    out: str | None,
    budget_s: float | None,
    study: str | None,
    network: bool,
    local_ranks: int | None,
    devices: int | None,
    no_progress: bool,
) -> None:
    """Measure this node (GEMMs, attention, memory bandwidth, the allocator's reserve, collectives among its
    devices) and write a hardware profile for a study's ``cluster.profile``; with ``--network``, measure the
    collectives between the cluster's nodes and write the CSV for ``cluster.network``."""
    from ..spec import StudySpec
    from ..workloads.calibrate import calibrate as measure
    from ..workloads.calibrate import check_request

    if network:
        _network(device, out or "network.csv", 120.0 if budget_s is None else budget_s, study, local_ranks)
        return
    if local_ranks is not None:
        raise SpecError("--local-ranks: only with --network (the node's own collectives: --devices)")
    if out is None:
        raise SpecError("--out: give the profile's path (e.g. --out node.yaml)")
    budget_s = 300.0 if budget_s is None else budget_s
    check_output_path(out, "--out")
    spec = StudySpec.from_yaml(study) if study else None
    check_request(device, budget_s, devices)
    progress = _Progress(budget_s, not no_progress)
    try:
        profile = measure(device, budget_s, study=spec, devices=devices, progress=progress)
    finally:
        progress.close()
    try:
        path = profile.save(out)
    except OSError as exc:
        raise SpecError(f"--out {out!r}: cannot write the profile ({exc.strerror or exc})") from None
    fit = profile.fitted
    gemm = fit.gemm.get(profile.compute_dtype)
    click.echo(
        f"wrote {path}: {profile.device.name} x{profile.device.count}, {len(profile.gemm)} GEMMs, "
        f"{len(profile.attention)} attention shapes, {len(profile.memory)} memory kernels, "
        f"{len(profile.collectives.points)} collective points in {profile.elapsed_s:.0f} s"
    )
    if gemm is not None:
        click.echo(
            f"  {profile.compute_dtype} GEMM: up to {gemm.peak_tflops:,.3g} TFLOP/s (fit error {gemm.mape:.0%})"
        )
    if fit.memory is not None:
        click.echo(
            f"  memory-bound kernels: {fit.memory.bandwidth_gbs:,.0f} GB/s + {fit.memory.kernel_us:.1f} us"
        )
    for op, why in profile.collectives.unsupported.items():
        click.echo(f"  {op}: not measured ({why})")


def _network(device: str, out: str, budget_s: float, study: str | None, local_ranks: int | None) -> None:
    """``calibrate --network``: the probe across the nodes, its CSV written, the study line to add printed."""
    import os

    from ..run.base import RunFailure
    from ..spec import StudySpec
    from ..workloads.netprobe import check_network_request, measure_network

    check_output_path(out, "--out")
    spec = StudySpec.from_yaml(study) if study else None
    check_network_request(budget_s, local_ranks, spec, device)
    where = f"{local_ranks} local processes" if local_ranks else f"the study's runner ({spec.runner.kind})"  # type: ignore[union-attr]
    click.echo(f"calibrate --network: measuring through {where} for {budget_s:g} s", err=True)
    try:
        rows = measure_network(out, budget_s, device, study=spec, local_ranks=local_ranks)
    except RunFailure as exc:
        click.echo(f"error: {exc}", err=True)
        raise SystemExit(1) from None
    colls = sorted({r[0] for r in rows})
    scopes = sorted({(r[1], r[2]) for r in rows})
    click.echo(
        f"wrote {out}: {len(rows)} points, {', '.join(colls)} over "
        + ", ".join(f"{n} ranks ({k} per node)" for n, k in scopes)
    )
    if study:  # a path relative to the study file, as cluster.network reads it
        where = os.path.relpath(os.path.abspath(out), os.path.dirname(os.path.abspath(study)))
    else:  # no study named: the absolute path reads right from any study file
        where = os.path.abspath(out)
    click.echo(f"add to the study: cluster.network: {where}")
