"""The local GPT workload: real DDP training on CPU through the command runner (dp=2), refusals, MoE."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from primus_optuna.run.base import LaunchFailure, RunContext
from primus_optuna.run.presets import build_command_runner
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec
from primus_optuna.workloads import gpt

ROOT = Path(__file__).resolve().parents[2]


def _local_spec() -> StudySpec:
    data = StudySpec.from_yaml(ROOT / "studies" / "local-gpt-cpu.yaml").to_dict()
    # smaller still, so two real torchrun launches stay within a few seconds each
    data["model"].update(num_layers=1, hidden_size=64, ffn_hidden_size=128, vocab_size=256)
    data["workload"].update(seq_length=32, global_batch_size=8)
    data["search"]["axes"]["mbs"] = [1, 2, 4]
    return StudySpec.from_dict(data)


@pytest.mark.timeout(240)
def test_local_workload_dp2_through_command_runner(tmp_path: Path) -> None:
    spec = _local_spec()
    runner = build_command_runner(spec, "local", {"train_iters": 4, "timeout_s": 200})
    space = Space(spec)
    configs = [space.make(mbs=1, recompute="none"), space.make(mbs=2, recompute="full")]
    for i, config in enumerate(configs):
        assert config.dp == 2
        ctx = RunContext(spec=spec, workdir=tmp_path / f"t{i}", trial_number=i)
        m = runner.run(config, ctx)
        report = json.loads((ctx.workdir / "workload_report.json").read_text())
        assert report["world"] == 2 and report["iterations_averaged"] == [3, 4]
        # the parsed throughput is the workload's own steady-state figure
        assert m.tokens_per_s_per_gpu == pytest.approx(report["tokens_per_s_per_gpu"], rel=1e-6)
        assert m.step_time_s == pytest.approx(report["step_time_s"], rel=1e-6)
        assert m.peak_memory_gib == pytest.approx(report["peak_memory_gib"], abs=1e-3)
        assert m.source == "measured" and m.details["iterations_averaged"] == [3, 4]
        log = Path(m.log_path or "").read_text()
        assert f"micro-batches={8 // (config.mbs * 2)} recompute={config.recompute}" in log


@pytest.mark.parametrize(
    ("flag", "axis"),
    [
        ("--tensor-model-parallel-size", "tp"),
        ("--pipeline-model-parallel-size", "pp"),
        ("--expert-model-parallel-size", "ep"),
        ("--context-parallel-size", "cp"),
    ],
)
def test_refuses_model_parallelism(flag: str, axis: str, capsys: pytest.CaptureFixture[str]) -> None:
    assert gpt.main([flag, "2"]) == gpt.EXIT_REFUSED
    err = capsys.readouterr().err
    assert f"{axis}=2" in err and "data parallelism only" in err


def test_refusal_surfaces_as_launch_failure(tmp_path: Path) -> None:
    data = _local_spec().to_dict()
    data["search"]["axes"]["tp"] = [1, 2]
    spec = StudySpec.from_dict(data)
    runner = build_command_runner(spec, "command", {"argv": ["{python}", "-m", "primus_optuna.workloads.gpt",
                                                             "--tensor-model-parallel-size", "{tp}"]})  # fmt: skip
    with pytest.raises(LaunchFailure) as exc:
        runner.run(Space(spec).make(tp=2), RunContext(spec=spec, workdir=tmp_path))
    assert "data parallelism only" in exc.value.log_tail


def test_single_process_moe_with_recompute(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    report = tmp_path / "r.json"
    argv = ["--num-layers", "1", "--hidden-size", "32", "--num-attention-heads", "2", "--ffn-hidden-size", "32",
            "--vocab-size", "64", "--num-experts", "4", "--moe-router-topk", "2", "--seq-length", "16",
            "--global-batch-size", "4", "--micro-batch-size", "2", "--train-iters", "3", "--recompute",
            "selective", "--device", "cpu", "--report-json", str(report)]  # fmt: skip
    assert gpt.main(argv) == 0
    out = capsys.readouterr().out
    assert "moe=True" in out and out.count("tokens/s/GPU inst/harmonic mean") == 3
    assert json.loads(report.read_text())["iterations_averaged"] == [3]
