"""A study in which no legal configuration fits in memory: space, plan and run say so first; run creates
nothing; export does not suggest running longer."""

import re
from pathlib import Path

import optuna
import yaml
from click.testing import CliRunner

from primus_optuna import Space, StudySpec, estimate_memory, no_fit_message
from primus_optuna.cli import cli
from tests.conftest import small_moe_study

# Mixtral 8x22B (141 B parameters) on one node of 8 H100: no split fits in 8 x 80 GB
IMPOSSIBLE = {
    "name": "impossible",
    "model": {"catalog": "mixtral-8x22b"},
    "cluster": {"gpu": "h100", "nodes": 1, "gpus_per_node": 8},
    "workload": {"seq_length": 4096, "global_batch_size": 32, "precision": "bf16"},
    "search": {"baseline": {"tp": 1, "pp": 1, "ep": 8, "mbs": 1}},
}
NO_FIT = re.compile(
    r"^no configuration fits: the smallest peak is (\d+\.\d) GiB on stage \d+ with .+; usable is (\d+\.\d) GiB"
)


def _write(tmp_path: Path, data: dict) -> Path:
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_message_names_the_true_smallest_peak():
    spec = StudySpec.from_dict(IMPOSSIBLE)
    space = Space(spec)
    peaks = [estimate_memory(spec, c).peak_gib for c in space.configs()]
    m = NO_FIT.match(no_fit_message(spec, space) or "")
    assert m, no_fit_message(spec, space)
    assert float(m.group(1)) == round(min(peaks), 1) and float(m.group(1)) > float(m.group(2))
    assert no_fit_message(StudySpec.from_dict(small_moe_study())) is None


def test_space_and_plan_say_so_first(tmp_path):
    study = _write(tmp_path, IMPOSSIBLE)
    for cmd in ("space", "plan"):
        r = invoke(cmd, study)
        assert r.exit_code == 0, r.output
        assert NO_FIT.match(r.output.splitlines()[0]), r.output
    r = invoke("space", study)
    assert "does NOT fit in memory" in r.output  # the baseline line
    r = invoke("space", study, "--json")
    assert r.exit_code == 0 and '"no_fit": "no configuration fits' in r.output


def test_space_and_check_say_whether_the_baseline_fits(tmp_path):
    study = _write(tmp_path, small_moe_study())
    r = invoke("space", study)
    assert r.exit_code == 0 and "no configuration fits" not in r.output
    assert re.search(
        r"\n  (fits|does NOT fit) in memory: \d+\.\d GiB on stage \d+ (<=|>) \d+\.\d GiB", r.output
    )
    r = invoke("check", study, "--config", "tp=1")
    assert r.exit_code == 0 and "fits in memory" in r.output


def test_run_exits_2_and_creates_nothing(tmp_path):
    study = _write(tmp_path, IMPOSSIBLE)
    db = tmp_path / "i.db"
    r = invoke("run", study, "--storage", f"sqlite:///{db}", "--n-trials", 3, "--no-progress")
    assert r.exit_code == 2
    assert r.output.startswith("error: no configuration fits: the smallest peak is")
    assert not db.exists()


def test_export_of_a_study_pruned_by_memory_does_not_suggest_running_longer():
    import pytest

    from primus_optuna.errors import SpecError
    from primus_optuna.record.export import select_trial

    study = optuna.create_study(study_name="pruned", direction="maximize")
    for _ in range(2):
        t = study.ask()
        t.set_user_attr("prune_reason", "memory: 301.2 GiB on stage 0 > 71.6 GiB usable")
        study.tell(t, state=optuna.trial.TrialState.PRUNED)
    with pytest.raises(SpecError) as exc:
        select_trial(study)
    assert "pruned because nothing fits in memory (running longer will not help)" in str(exc.value)
    assert "run it longer" not in str(exc.value)


def test_run_warns_about_an_illegal_baseline_instead_of_repairing_it_silently(tmp_path):
    data = small_moe_study(baseline={"tp": 1, "pp": 2, "ep": 4, "mbs": 64})
    r = invoke(
        "run",
        _write(tmp_path, data),
        "--storage",
        f"sqlite:///{tmp_path / 'b.db'}",
        "--n-trials",
        1,
        "--no-progress",
    )
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("warning: "))
    assert "baseline is illegal" in line and "global_batch_size=32 is not divisible by mbs" in line
    assert "the sweep starts from tp1-" in line  # the centre by its key, as the sweep attr names it


def test_run_warns_about_a_baseline_that_does_not_fit_with_the_estimate_named_as_one(tmp_path):
    data = small_moe_study(baseline={"tp": 1, "pp": 1, "ep": 1, "mbs": 4})
    url = f"sqlite:///{tmp_path / 'f.db'}"
    r = invoke("run", _write(tmp_path, data), "--storage", url, "--n-trials", 1, "--no-progress")
    assert r.exit_code == 0, r.output
    line = next(x for x in r.output.splitlines() if x.startswith("warning: "))
    assert "baseline does not fit in memory" in line
    assert re.search(r"\(estimated memory: \d+\.\d GiB on stage \d+ > \d+\.\d GiB usable\)", line), line


def test_a_peak_far_over_the_device_does_not_suggest_lowering_the_safety_margin():
    """Issue 39 item 12: lowering the margin only helps when the whole device would hold the smallest peak."""
    far = StudySpec.from_dict(IMPOSSIBLE)
    message = no_fit_message(far) or ""
    assert float(NO_FIT.match(message).group(1)) > far.cluster.gpu.hbm_gib
    assert "memory_safety_margin" not in message.split("To fix:")[1]
    # a peak between the usable memory and the device's: lowering the margin is a fix
    space = Space(far)
    smallest = min(estimate_memory(far, c).peak_gib for c in space.configs())
    gpus = {"gpu": {"catalog": "h100", "memory_gib": round(smallest / 0.95, 1)}}
    near = StudySpec.from_dict({**IMPOSSIBLE, "cluster": {**IMPOSSIBLE["cluster"], **gpus}})
    assert "lower search.memory_safety_margin" in (no_fit_message(near) or "")
