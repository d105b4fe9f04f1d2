"""``import primus_optuna``, the sampler, the pruners and the analytical objective need only the core
dependencies (optuna, numpy, pydantic, PyYAML): the heavy ones are extras (``llm``, ``dashboard``, ``plots``,
``profile``) and are imported lazily. Checked in a fresh interpreter with them blocked."""

import subprocess
import sys
import textwrap

from tests.conftest import ROOT

HEAVY = ("torch", "dspy", "litellm", "optuna_dashboard", "matplotlib", "pandas", "plotly", "scipy", "click")

SCRIPT = textwrap.dedent(
    f"""
    import importlib.abc, sys

    class Block(importlib.abc.MetaPathFinder):
        def find_spec(self, name, path=None, target=None):
            if name.split(".")[0] in {HEAVY!r}:
                raise ImportError(f"blocked: {{name}} is not a core dependency")
            return None

    sys.meta_path.insert(0, Block())
    import optuna
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    import primus_optuna
    from primus_optuna import MemoryPrefilterPruner, PrimusSampler, StudySpec, make_objective
    from tests.conftest import small_moe_study

    spec = StudySpec.from_dict(small_moe_study())
    study = optuna.create_study(direction="maximize", sampler=PrimusSampler(spec),
                                pruner=MemoryPrefilterPruner(spec=spec))
    study.optimize(make_objective(spec), n_trials=3)
    assert len(study.trials) == 3 and study.best_value > 0
    loaded = sorted(m for m in sys.modules if m.split(".")[0] in {HEAVY!r})
    assert not loaded, loaded
    print("ok")
    """
)


def test_import_and_sampler_need_only_the_core_dependencies():
    proc = subprocess.run(
        [sys.executable, "-c", SCRIPT], cwd=ROOT, capture_output=True, text=True, timeout=240
    )
    assert proc.returncode == 0 and proc.stdout.strip().endswith("ok"), proc.stderr[-3000:]
