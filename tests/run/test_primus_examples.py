"""AMD's example Primus experiments (tests/data/primus-examples, AMD-AGI/Primus@fd1eeabb) as the primus runner's
``experiment``: every overlay builds, loads with Primus's loader rules and keeps the trial's values."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from primus_optuna.errors import SpecError
from primus_optuna.run.base import RunContext
from primus_optuna.run.factory import make_runner
from primus_optuna.run.presets import OVERLAY_NAME, primus_overlay, primus_overrides
from primus_optuna.space import Space, TrainingConfig
from primus_optuna.spec import MODEL_CATALOG, StudySpec
from primus_optuna.spec.primus_env import has_template, resolve_primus_env

EXAMPLES = Path(__file__).resolve().parents[1] / "data" / "primus-examples"
PRETRAIN = sorted(EXAMPLES.glob("*/*-pretrain.yaml"))
FINE_TUNING = sorted(p for p in EXAMPLES.glob("*/*.yaml") if "-sft" in p.name)


def _catalog_model(path: Path) -> str:
    """The catalog model an example file is of (``qwen3_30B_A3B-FP8-pretrain.yaml`` -> ``qwen3-30b-a3b``)."""

    def key(name: str) -> str:
        return "".join(c for c in name.lower() if c.isalnum())

    stem = key(path.name.split("-")[0].replace("_v0.1", ""))
    return next(name for name in MODEL_CATALOG if key(name) == stem)


def _study(path: Path) -> StudySpec:
    precision = "fp8" if "-FP8-" in path.name else "bf16"
    return StudySpec.from_dict(
        {
            "name": path.stem,
            "model": {"catalog": _catalog_model(path)},
            "cluster": {"gpu": path.parent.name.lower(), "nodes": 4, "gpus_per_node": 8},
            "workload": {"seq_length": 4096, "global_batch_size": 256, "precision": precision},
        }
    )


def _configs(spec: StudySpec) -> list[TrainingConfig]:
    space = Space(spec)
    legal = space.configs()
    return [space.baseline, legal[len(legal) // 2], legal[-1]]


def test_the_examples_are_those_of_the_catalog_models() -> None:
    assert len(PRETRAIN) == 51 and len(FINE_TUNING) == 6
    assert {p.parent.name for p in PRETRAIN} == {"MI300X", "MI355X"}
    # 29 of them write max_position_embeddings as a template: every overlay of those failed before
    templated = [p for p in PRETRAIN if has_template(_overrides(p).get("max_position_embeddings"))]
    assert len(templated) == 29


def _overrides(path: Path) -> dict:
    return yaml.safe_load(path.read_text())["modules"]["pre_trainer"]["overrides"]


@pytest.mark.parametrize("path", PRETRAIN, ids=lambda p: f"{p.parent.name}/{p.stem}")
def test_every_overlay_loads_as_primus_loads_it_and_keeps_the_trial(path: Path) -> None:
    spec = _study(path)
    experiment = yaml.safe_load(path.read_text())
    for config in _configs(spec):
        # written as the runner writes it, read back as Primus's loader reads it (environment without PRIMUS_*)
        text = yaml.safe_dump(
            primus_overlay(spec, config, experiment=experiment, environ={}), sort_keys=False
        )
        raw = yaml.safe_load(text)
        loaded = resolve_primus_env(raw, {})
        overrides = loaded["modules"]["pre_trainer"]["overrides"]
        for key, value in primus_overrides(spec, config).items():
            assert overrides[key] == value, key
        assert overrides["max_position_embeddings"] >= spec.workload.seq_length
        # what the trial does not set is left as written, for Primus to resolve
        written = raw["modules"]["pre_trainer"]
        assert written["model"] == experiment["modules"]["pre_trainer"]["model"]
        for key in ("work_group", "user_name", "exp_name", "workspace"):
            assert raw[key] == experiment[key]
        for key, value in experiment["modules"]["pre_trainer"]["overrides"].items():
            if has_template(value) and key not in primus_overrides(spec, config):
                assert written["overrides"][key] == value, key


def test_a_large_enough_template_is_left_for_primus_and_a_small_one_replaced() -> None:
    path = EXAMPLES / "MI355X" / "qwen3_30B_A3B-BF16-pretrain.yaml"
    spec, experiment = _study(path), yaml.safe_load(path.read_text())
    template = "${PRIMUS_MAX_POSITION_EMBEDDINGS:4096}"
    assert _overrides(path)["max_position_embeddings"] == template

    def written(env: dict[str, str]) -> object:
        doc = primus_overlay(spec, Space(spec).baseline, experiment=experiment, environ=env)
        return doc["modules"]["pre_trainer"]["overrides"]["max_position_embeddings"]

    assert written({}) == template  # the default, 4096, covers seq 4096
    assert written({"PRIMUS_MAX_POSITION_EMBEDDINGS": "8192"}) == template
    assert written({"PRIMUS_MAX_POSITION_EMBEDDINGS": "2048"}) == 4096  # Megatron would refuse 2048 < 4096


def _runner(spec: StudySpec, options: dict) -> object:
    runner = spec.runner.model_copy(update={"kind": "primus", "options": {"launch": ["true"], **options}})
    return make_runner(spec.model_copy(update={"runner": runner}))


def test_the_launch_environment_resolves_the_templates(tmp_path: Path) -> None:
    """``runner.options.env`` reaches Primus's loader: its values decide what the overlay's templates become."""
    path = EXAMPLES / "MI300X" / "deepseek_v2_lite-BF16-pretrain.yaml"
    spec = _study(path)
    env = {"PRIMUS_MAX_POSITION_EMBEDDINGS": "1024"}
    runner = _runner(spec, {"experiment": str(path), "env": env})
    runner.build(Space(spec).baseline, RunContext(spec=spec, workdir=tmp_path / "t", trial_number=0))
    doc = yaml.safe_load((tmp_path / "t" / OVERLAY_NAME).read_text())
    assert doc["modules"]["pre_trainer"]["overrides"]["max_position_embeddings"] == 4096


def test_a_variable_without_default_must_be_set_for_the_launch(tmp_path: Path, monkeypatch) -> None:
    monkeypatch.delenv("MY_DATA", raising=False)
    exp = tmp_path / "exp.yaml"
    text = (EXAMPLES / "MI355X" / "mixtral_8x7B_v0.1-BF16-pretrain.yaml").read_text()
    exp.write_text(
        text.replace("      mock_data: true", "      mock_data: true\n      data_path: ${MY_DATA}")
    )
    spec = _study(EXAMPLES / "MI355X" / "mixtral_8x7B_v0.1-BF16-pretrain.yaml")
    with pytest.raises(
        SpecError, match=r"overrides\.data_path: \$\{MY_DATA\} needs the environment variable MY_DATA"
    ):
        _runner(spec, {"experiment": str(exp)})
    _runner(spec, {"experiment": str(exp), "env": {"MY_DATA": "/data/x"}})  # set for the launch: builds


def test_a_templated_architecture_value_is_compared_resolved() -> None:
    path = EXAMPLES / "MI355X" / "deepseek_v3-BF16-pretrain.yaml"
    spec, experiment = _study(path), yaml.safe_load(path.read_text())
    experiment["modules"]["pre_trainer"]["overrides"]["num_layers"] = "${PRIMUS_NUM_LAYERS:61}"
    primus_overlay(spec, Space(spec).baseline, experiment=experiment, environ={})  # 61 = the model's
    with pytest.raises(SpecError, match="num_layers: 4 but the study's model has 61"):
        primus_overlay(spec, Space(spec).baseline, experiment=experiment, environ={"PRIMUS_NUM_LAYERS": "4"})


@pytest.mark.parametrize("path", FINE_TUNING, ids=lambda p: p.stem)
def test_a_fine_tuning_experiment_is_refused_naming_its_trainer(path: Path) -> None:
    spec = _study(path)
    with pytest.raises(SpecError, match="no modules.pre_trainer \\(it runs post_trainer\\)"):
        primus_overlay(spec, Space(spec).baseline, experiment=yaml.safe_load(path.read_text()))
