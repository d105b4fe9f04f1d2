"""How often Optuna's own samplers land a legal configuration through ``suggest_config`` (issue 23 item 15).

For each study and sampler (TPE, Random; seeded), ``--trials`` trials of an objective that returns the
analytical tokens/s/GPU of the configuration run. Three ways of suggesting the ten axes:

- ``raw``: every axis over its raw candidate values, an illegal combination pruned (before issue 23);
- ``legal-values``: over each axis's legal values, an illegal combination pruned (``map_illegal=False``);
- ``mapped``: over the legal values, an illegal combination mapped to the nearest legal one (the default).

Reports the share of trials that ran a legal configuration, the distinct configurations run, and the best
estimate reached relative to the study's best feasible estimate (memory ignored: this is about legality).

    python scripts/bench_suggest.py --trials 60 --studies studies/mixtral-8x22b-mi355x-fp8.yaml
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

import optuna  # noqa: E402

from primus_optuna.physics.throughput import estimate_throughput  # noqa: E402
from primus_optuna.search.configs import legal_config  # noqa: E402
from primus_optuna.search.suggest import suggest_config  # noqa: E402
from primus_optuna.space import Space, TrainingConfig  # noqa: E402
from primus_optuna.spec import StudySpec  # noqa: E402
from primus_optuna.spec.study import AXES  # noqa: E402

DEFAULT_STUDIES = (
    "studies/mixtral-8x22b-mi355x-fp8.yaml",
    "studies/qwen3-30b-a3b-h200-bf16.yaml",
    "studies/llama3.1-70b-h100-bf16.yaml",
)


def run(
    spec: StudySpec, space: Space, mode: str, sampler: str, trials: int, seed: int
) -> tuple[int, int, float]:
    ran: list[TrainingConfig] = []

    def objective(trial: optuna.Trial) -> float:
        if mode == "raw":
            params = {a: trial.suggest_categorical(a, list(space.candidates[a])) for a in AXES}
            config, _ = legal_config(space, params)
            if config is None:
                raise optuna.TrialPruned()
        else:
            config = suggest_config(trial, spec, space, map_illegal=mode == "mapped")
        ran.append(config)
        return estimate_throughput(spec, config).tokens_per_s_per_gpu

    s = (
        optuna.samplers.TPESampler(seed=seed)
        if sampler == "tpe"
        else optuna.samplers.RandomSampler(seed=seed)
    )
    study = optuna.create_study(direction="maximize", sampler=s)
    study.optimize(objective, n_trials=trials)
    best = max((estimate_throughput(spec, c).tokens_per_s_per_gpu for c in ran), default=0.0)
    return len(ran), len(set(ran)), best


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--trials", type=int, default=60)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--studies", nargs="*", default=list(DEFAULT_STUDIES))
    args = ap.parse_args()
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    print("| study | sampler | suggestion | legal trials | distinct configs | best / best legal estimate |")
    print("|---|---|---|---|---|---|")
    for path in args.studies:
        spec = StudySpec.from_yaml(path)
        space = Space(spec)
        top = max(estimate_throughput(spec, c).tokens_per_s_per_gpu for c in space.configs())
        for sampler in ("tpe", "random"):
            for mode in ("raw", "legal-values", "mapped"):
                legal = distinct = 0
                best = 0.0
                for seed in range(args.seeds):
                    n, d, b = run(spec, space, mode, sampler, args.trials, seed)
                    legal, distinct, best = legal + n, distinct + d, best + b
                k = args.seeds * args.trials
                print(
                    f"| {spec.name} | {sampler} | {mode} | {legal / k:.0%} | {distinct / args.seeds:.1f} | "
                    f"{best / args.seeds / top:.2f} |"
                )


if __name__ == "__main__":
    main()
