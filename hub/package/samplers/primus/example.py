"""Find the fastest configuration of the bundled small study with PrimusSampler (analytical estimates, no GPU).

Run from a checkout: ``python hub/package/samplers/primus/example.py``; from OptunaHub once published:
``optunahub.load_module("samplers/primus")``.
"""

from __future__ import annotations

from pathlib import Path

import optuna
import optunahub


def main(n_trials: int = 20) -> optuna.Study:
    registry = Path(__file__).resolve().parents[2]  # hub/package
    module = optunahub.load_local_module(package="samplers/primus", registry_root=str(registry))
    spec = module.example_spec()
    study = optuna.create_study(
        direction="maximize",
        sampler=module.PrimusSampler(spec, seed=0),
        pruner=module.MemoryPrefilterPruner(spec=spec),
    )
    study.optimize(module.make_objective(spec, module.AnalyticalRunner(spec)), n_trials=n_trials)
    best = study.best_trial
    print(f"best: {best.user_attrs['config_key']} at {best.value:.0f} tokens/s/GPU (estimated)")
    return study


if __name__ == "__main__":
    main()
