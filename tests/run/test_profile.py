"""The profile runner on tiny shapes on CPU: timing, cache, FLOP-corrected scaling, projection."""

from __future__ import annotations

from pathlib import Path

import pytest

from primus_optuna.errors import SpecError
from primus_optuna.physics.shapes import LayerShape
from primus_optuna.physics.throughput import estimate_throughput
from primus_optuna.run import profile
from primus_optuna.run.base import RunContext
from primus_optuna.run.factory import make_runner
from primus_optuna.run.profile import ProfileRunner, layer_flops, scaled_shape
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec
from tests.helpers.runners import mixtral_spec

ROOT = Path(__file__).resolve().parents[2]


def _tiny() -> StudySpec:
    return StudySpec.from_yaml(ROOT / "studies" / "local-gpt-cpu.yaml")


def test_scaled_shape_and_flop_correction() -> None:
    spec = mixtral_spec()
    config = Space(spec).baseline.replace(tp=2).derive(spec.world, 128)
    full = LayerShape.from_config(spec, config)
    small = scaled_shape(full, 0.05)
    assert small.heads // small.groups == full.heads // full.groups  # GQA ratio kept
    assert small.seq % small.tp == 0 and small.local_experts == full.local_experts
    assert scaled_shape(full, 1.0) == full
    ratio = layer_flops(full) / layer_flops(small)
    assert 1e3 < ratio < 1e5
    assert layer_flops(full, "full") > layer_flops(full, "selective") > layer_flops(full)


def test_profiles_dense_layer_with_cache(tmp_path: Path) -> None:
    spec = _tiny()
    cache = tmp_path / "cache.json"
    runner = ProfileRunner(spec, warmup=1, repeats=2, cache=cache)
    space = Space(spec)
    ctx = RunContext(spec=spec, workdir=tmp_path / "t0")
    a = runner.run(space.make(mbs=2), ctx)
    assert a.source == "profiled" and a.tokens_per_s_per_gpu > 0 and a.step_time_s > 0
    assert not a.details["cache_hit"] and a.details["flop_correction"] == 1.0 and cache.is_file()
    b = runner.run(space.make(mbs=2), ctx)
    assert b.details["cache_hit"] and b.tokens_per_s_per_gpu == a.tokens_per_s_per_gpu
    c = runner.run(space.make(mbs=2, recompute="full"), ctx)
    assert not c.details["cache_hit"]
    assert (runner.hits, runner.misses) == (1, 2)
    # a new runner reads the same cache file
    assert (
        ProfileRunner(spec, warmup=1, repeats=2, cache=cache).run(space.make(mbs=2), ctx).details["cache_hit"]
    )


def test_moe_layer_scaled_on_cpu(tmp_path: Path) -> None:
    spec = mixtral_spec()
    runner = ProfileRunner(spec, scale=0.02, warmup=1, repeats=2, device="cpu")
    config = Space(spec).baseline
    m = runner.run(config, RunContext(spec=spec, workdir=tmp_path / "t0"))
    d = m.details
    assert d["profiled_shape"]["moe"] and d["profiled_shape"]["local_experts"] == 1
    assert d["layer_s"] == pytest.approx(d["measured_s"] * d["shape_correction"])
    # the curves say the tiny profiled GEMMs ran at a lower fraction of peak than the full ones will
    assert 1.0 < d["shape_correction"] < d["flop_correction"]
    assert (tmp_path / "profile_cache.json").is_file()  # default: next to the trial directories
    assert d["layers_per_stage"] == 14 and d["num_microbatches"] == config.num_microbatches


def test_projection_keeps_communication_and_replaces_compute(tmp_path: Path, monkeypatch) -> None:
    spec = mixtral_spec()
    config = Space(spec).baseline
    est = estimate_throughput(spec, config)
    b = est.breakdown_s
    layer_terms = sum(b[k] for k in profile.LAYER_TERMS)
    per_layer = layer_terms / (spec.model.num_layers / config.pp * config.num_microbatches)
    # a device exactly as fast as the model assumes reproduces the estimate ...
    monkeypatch.setattr(
        profile, "time_layer", lambda *a, **k: {"fwd_bwd_s": per_layer, "times_s": [per_layer]}
    )
    m = ProfileRunner(spec, cache=tmp_path / "a.json", device="cpu").run(
        config, RunContext(spec=spec, workdir=tmp_path / "a")
    )
    assert m.tokens_per_s_per_gpu == pytest.approx(est.tokens_per_s_per_gpu, rel=1e-9)
    # ... one twice as slow doubles the layer compute and the bubble, and nothing else
    monkeypatch.setattr(profile, "time_layer", lambda *a, **k: {"fwd_bwd_s": 2 * per_layer, "times_s": []})
    m2 = ProfileRunner(spec, cache=tmp_path / "b.json", device="cpu").run(
        config, RunContext(spec=spec, workdir=tmp_path / "b")
    )
    grow = layer_terms + b.get("pipeline_bubble", 0.0)
    assert m2.step_time_s == pytest.approx(est.step_time_s + grow, rel=1e-9)
    for k in ("tp_comm", "ep_comm", "pp_comm", "dp_comm", "optimizer", "compute_other"):
        assert m2.details["breakdown_s"][k] == pytest.approx(b[k], abs=1e-6)


def test_factory_builds_profile_runner() -> None:
    data = _tiny().to_dict()
    data["runner"] = {"kind": "profile", "options": {"scale": 0.5, "repeats": 2}}
    runner = make_runner(StudySpec.from_dict(data))
    assert isinstance(runner, ProfileRunner) and runner.options.scale == 0.5
    data["runner"]["options"] = {"scale": 2}
    with pytest.raises(SpecError, match="scale"):
        make_runner(StudySpec.from_dict(data))
    data["runner"]["options"] = {"repeat": 2}
    with pytest.raises(SpecError, match="unknown option"):
        make_runner(StudySpec.from_dict(data))


def test_refuses_cpu_timings_for_a_gpu_study_unless_asked(tmp_path: Path, monkeypatch, caplog) -> None:
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)  # a machine without a GPU
    spec = mixtral_spec()  # MI355X
    with pytest.raises(SpecError, match=r"no GPU.*mi355x.*runner.options.device: cpu"):
        ProfileRunner(spec, scale=0.02)
    data = spec.to_dict()
    data["runner"] = {"kind": "profile", "options": {"scale": 0.02}}
    with pytest.raises(SpecError, match="runner.options.device: cpu"):
        make_runner(StudySpec.from_dict(data))
    # asked explicitly: it runs, and every trial says its figure is a CPU one
    monkeypatch.setattr(profile, "time_layer", lambda *a, **k: {"fwd_bwd_s": 1.0, "times_s": [1.0]})
    runner = ProfileRunner(spec, scale=0.02, device="cpu", cache=tmp_path / "c.json")
    config = Space(spec).baseline
    with caplog.at_level("WARNING", logger="primus_optuna.run.profile"):
        for n in (0, 1):
            m = runner.run(config, RunContext(spec=spec, workdir=tmp_path / f"t{n}", trial_number=n))
    warnings = [r.getMessage() for r in caplog.records if "profiled on the CPU" in r.getMessage()]
    assert len(warnings) == 2 and "trial 1" in warnings[1] and "mi355x" in warnings[1]
    assert m.details["warning"]
    # a study of a CPU "GPU" (vendor other) is profiled on the CPU without a warning
    tiny = ProfileRunner(_tiny())
    assert not tiny.cpu_for_gpu


def test_the_profiled_layers_are_the_busiest_stages_of_the_estimate() -> None:
    """The projection replaces the compute terms of the stage the estimate's breakdown holds (its busiest,
    ThroughputEstimate.busiest_stage): with DeepSeek-V3's layout that is a middle stage of eight MoE layers, not
    the light last one (five, MTP and the loss) nor the dense-first one."""
    from primus_optuna.physics.throughput import estimate_throughput
    from primus_optuna.run.profile import _stage_layers
    from primus_optuna.spec import StudySpec
    from tests.conftest import STUDIES

    spec = StudySpec.from_yaml(STUDIES / "deepseek-v3-mi355x-fp8.yaml")
    config = Space(spec).baseline
    est = estimate_throughput(spec, config)
    assert 0 < est.busiest_stage < config.pp - 1
    assert _stage_layers(spec, config, est.busiest_stage) == 8
    assert _stage_layers(spec, config, config.pp - 1) == 6  # 5 MoE + MTP
