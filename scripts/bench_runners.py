"""Benchmark of the measured runners: estimate vs measured tokens/s/GPU on the local CPU study.

Runs ``primus-optuna run studies/local-gpt-cpu.yaml`` (runner kind ``local``: the GPT workload trained for real
by two torchrun processes, dp=2) into a fresh SQLite storage, then prints every measured trial's estimate,
measurement and ``estimate_error`` (= estimate / measured - 1) with their mean and median.

python scripts/bench_runners.py [--study studies/local-gpt-cpu.yaml] [--n-trials 12] [--keep DIR]
python scripts/bench_runners.py --calibrate-s 60      # calibrate this CPU first, then run with that profile
python scripts/bench_runners.py --hardware-profile P  # run with an existing hardware profile

``--calibrate-s`` runs ``primus-optuna calibrate --device cpu --study STUDY --budget-s N`` right before the
study (the machine's load then is the run's) and the study with ``cluster.profile`` set to what it wrote;
each measured trial's catalog estimate (the study without the profile) is printed beside it.

``--profile`` also times the Mixtral 8x22B layer of the flagship baseline (mbs 1 and 2) with the profile
runner at ``--scale`` on this CPU and prints it next to the step-time model's per-layer compute: a smoke
figure of the FLOP-scaled projection, not a GPU measurement.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def calibrate_cpu(study: Path, budget_s: float, out: Path) -> float:
    """``primus-optuna calibrate --device cpu`` of ``study``'s shapes into ``out``; returns its wall seconds."""
    exe = shutil.which("primus-optuna") or str(Path(sys.executable).with_name("primus-optuna"))
    cmd = [exe, "calibrate", "--device", "cpu", "--study", str(study), "--budget-s", str(budget_s)]
    t0 = time.perf_counter()
    proc = subprocess.run([*cmd, "--out", str(out), "--no-progress"], capture_output=True, text=True)
    if proc.returncode != 0:
        sys.exit(f"primus-optuna calibrate failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    print(proc.stdout.strip())
    return time.perf_counter() - t0


def with_profile(study: Path, profile: Path, workdir: Path) -> Path:
    """A copy of ``study`` in ``workdir`` whose ``cluster.profile`` is ``profile``."""
    import yaml

    data = yaml.safe_load(study.read_text())
    data["cluster"]["profile"] = str(profile.resolve())
    out = workdir / study.name
    out.write_text(yaml.safe_dump(data, sort_keys=False))
    return out


def run_study(study: Path, n_trials: int, workdir: Path) -> tuple[str, str, float]:
    storage = f"sqlite:///{workdir / 'bench.db'}"
    exe = shutil.which("primus-optuna") or str(Path(sys.executable).with_name("primus-optuna"))
    cmd = [
        exe,
        "run",
        str(study),
        "--storage",
        storage,
        "--no-llm",
        "--no-progress",
        "--n-trials",
        str(n_trials),
    ]
    t0 = time.perf_counter()
    proc = subprocess.run(cmd, cwd=workdir, capture_output=True, text=True, env={**os.environ})
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        sys.exit(f"primus-optuna run failed ({proc.returncode}):\n{proc.stdout}\n{proc.stderr}")
    return storage, proc.stdout, wall


def table(storage: str, catalog_study: Path | None = None) -> list[str]:
    """Each trial's estimate, measurement and error; with ``catalog_study`` (the study without its profile)
    also the catalog's estimate of each measured configuration and its error."""
    import optuna

    from primus_optuna.physics.throughput import estimate_throughput
    from primus_optuna.search.configs import trial_config
    from primus_optuna.space import Space
    from primus_optuna.spec import StudySpec

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    summaries = optuna.get_all_study_summaries(storage)
    study = optuna.load_study(study_name=summaries[0].study_name, storage=storage)
    catalog = StudySpec.from_yaml(catalog_study) if catalog_study else None
    space = Space(catalog) if catalog else None
    lines = [
        f"{'trial':>5} {'configuration':<42} {'estimate':>9} {'measured':>9} {'error':>8} {'peak GiB':>8}"
        + ("  catalog estimate, error" if catalog else ""),
    ]
    errors, catalog_errors = [], []
    for t in study.trials:
        ua = t.user_attrs
        if t.state != optuna.trial.TrialState.COMPLETE or "measured_tokens_per_s_per_gpu" not in ua:
            reason = ua.get("failure_reason") or ua.get("prune_reason") or ""
            lines.append(f"{t.number:>5} {ua.get('config_key', '-'):<42} {t.state.name.lower()} {reason}")
            continue
        err = ua["estimate_error"]
        errors.append(err)
        peak = ua.get("measured_peak_memory_gib")
        line = (
            f"{t.number:>5} {ua['config_key']:<42} {ua['estimate_tokens_per_s_per_gpu']:>9.1f} "
            f"{ua['measured_tokens_per_s_per_gpu']:>9.1f} {err:>+8.1%} {peak if peak is not None else '-':>8}"
        )
        if catalog is not None and space is not None:
            config = trial_config(space, t)
            if config is not None:
                est = estimate_throughput(catalog, config).tokens_per_s_per_gpu
                catalog_errors.append(est / ua["measured_tokens_per_s_per_gpu"] - 1)
                line += f"  {est:>9.1f} {catalog_errors[-1]:>+8.1%}"
        lines.append(line)
    for name, errs in (("estimate_error", errors), ("catalog estimate_error", catalog_errors)):
        if errs:
            lines.append(
                f"{name} over {len(errs)} measured trials: mean {statistics.mean(errs):+.1%}, "
                f"median {statistics.median(errs):+.1%}, mean |error| {statistics.mean(abs(e) for e in errs):.1%}, "
                f"max |error| {max(abs(e) for e in errs):.1%}"
            )
    return lines


def profile_mixtral(scale: float) -> list[str]:
    from primus_optuna.physics.throughput import estimate_throughput
    from primus_optuna.run.base import RunContext
    from primus_optuna.run.profile import LAYER_TERMS, ProfileRunner
    from primus_optuna.space import Space
    from primus_optuna.spec import StudySpec

    spec = StudySpec.from_yaml(ROOT / "studies" / "mixtral-8x22b-mi355x-fp8.yaml")
    space = Space(spec)
    lines = [
        f"{'mbs':>3} {'profiled ms (scaled)':>20} {'FLOP corr.':>10} {'layer ms':>10} {'model layer ms':>14}"
    ]
    with tempfile.TemporaryDirectory() as tmp:
        import torch

        # this benchmark reports CPU timings knowingly on a machine without a GPU (a smoke figure)
        device = "auto" if torch.cuda.is_available() else "cpu"
        runner = ProfileRunner(spec, scale=scale, warmup=1, repeats=3, device=device)
        for mbs in (1, 2):
            config = space.canonical(space.baseline.replace(mbs=mbs))
            m = runner.run(config, RunContext(spec=spec, workdir=Path(tmp) / f"mbs{mbs}"))
            est = estimate_throughput(spec, config)
            per = spec.model.num_layers / config.pp * config.num_microbatches
            model_ms = sum(est.breakdown_s[k] for k in LAYER_TERMS) / per * 1000
            d = m.details
            lines.append(
                f"{mbs:>3} {d['measured_s'] * 1000:>20.1f} {d['flop_correction']:>10.0f} "
                f"{d['layer_s'] * 1000:>10.0f} {model_ms:>14.1f}"
            )
    return lines


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", type=Path, default=ROOT / "studies" / "local-gpt-cpu.yaml")
    ap.add_argument("--n-trials", type=int, default=12)
    ap.add_argument(
        "--keep", type=Path, default=None, help="keep the storage and trial logs in this directory"
    )
    ap.add_argument(
        "--profile", action="store_true", help="also profile the Mixtral layer (CPU smoke figure)"
    )
    ap.add_argument("--scale", type=float, default=0.03)
    ap.add_argument(
        "--calibrate-s",
        type=float,
        default=None,
        metavar="SECONDS",
        help="calibrate this CPU for the study first (this budget), then run the study with that profile",
    )
    ap.add_argument("--hardware-profile", type=Path, default=None, help="run the study with this profile")
    args = ap.parse_args()
    workdir = args.keep or Path(tempfile.mkdtemp(prefix="bench-runners-"))
    workdir.mkdir(parents=True, exist_ok=True)
    study = args.study.resolve()
    profile = args.hardware_profile
    if args.calibrate_s is not None:
        profile = workdir / "cpu-profile.yaml"
        wall = calibrate_cpu(study, args.calibrate_s, profile)
        print(f"primus-optuna calibrate --device cpu --budget-s {args.calibrate_s:g}: {wall:.0f} s wall")
    catalog = None
    if profile is not None:
        catalog, study = study, with_profile(study, profile, workdir)
    storage, out, wall = run_study(study, args.n_trials, workdir)
    print(f"primus-optuna run {args.study.name} --n-trials {args.n_trials}: {wall:.0f} s wall")
    for line in table(storage, catalog):
        print(line)
    if args.profile:
        print(f"\nMixtral 8x22B layer, flagship baseline, profile runner at scale {args.scale} on this CPU:")
        for line in profile_mixtral(args.scale):
            print(line)
    if args.keep is None:
        shutil.rmtree(workdir, ignore_errors=True)


if __name__ == "__main__":
    main()
