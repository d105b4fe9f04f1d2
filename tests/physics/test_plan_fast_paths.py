"""The fast paths of ``plan`` give the estimates of the per-configuration functions to the last bit: the peak
memory of every configuration (:func:`peak_memory_all`), and the ranked throughput of :func:`plan_space`, on
studies with uneven layouts, MTP, MLA, dense-first layers and the zero-bubble schedules."""

from __future__ import annotations

import random
from pathlib import Path

import pytest

from primus_optuna.physics.memory import estimate_memory, peak_memory_all, peak_memory_gib
from primus_optuna.physics.plan import pareto_front, plan_space
from primus_optuna.physics.throughput import estimate_throughput, layout_of, throughput_bound
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec

STUDIES = Path(__file__).resolve().parents[2] / "studies"


def _sample(configs: list, n: int) -> list:
    step = max(1, len(configs) // n)
    return configs[::step]


@pytest.mark.parametrize(
    "name", ["deepseek-v3-mi355x-fp8", "llama3.1-70b-h100-bf16", "qwen3-30b-a3b-h200-bf16", "local-gpt-cpu"]
)
def test_peak_memory_all_is_estimate_memory_peak(name: str) -> None:
    spec = StudySpec.from_yaml(STUDIES / f"{name}.yaml")
    configs = _sample(Space(spec).configs(), 1500)
    peaks, usable = peak_memory_all(spec, configs)
    for c, peak in zip(configs, peaks, strict=True):
        mem = estimate_memory(spec, c)
        assert peak == mem.peak_gib, c
        assert (peak <= usable) == mem.fits
    assert peak_memory_gib(spec, configs[0]) == (peaks[0], usable)


def test_plan_space_ranks_the_per_configuration_estimates() -> None:
    spec = StudySpec.from_yaml(STUDIES / "llama3.1-70b-h100-bf16.yaml")
    space = Space(spec)
    result = plan_space(spec, space, top=5)
    fresh = StudySpec.from_yaml(STUDIES / "llama3.1-70b-h100-bf16.yaml")
    expected = []
    for c in space.configs():
        mem = estimate_memory(fresh, c)
        if mem.fits:
            expected.append((c, estimate_throughput(fresh, c).tokens_per_s_per_gpu, mem.peak_gib))
    expected.sort(key=lambda x: (-x[1], x[2]))
    assert [(e.config, e.tokens_per_s_per_gpu, e.peak_gib) for e in result.ranked] == expected
    assert result.pareto == pareto_front(result.ranked)
    ranked = result.ranked
    assert ranked[0].throughput == estimate_throughput(fresh, ranked[0].config)


@pytest.mark.parametrize("name", sorted(p.stem for p in STUDIES.glob("*.yaml")))
def test_throughput_bound_bounds_every_estimate(name: str) -> None:
    """On a random sample of every shipped study's legal configurations: each one's bound is at least its
    estimate (its step at most the estimated step: the bound never prunes a configuration that would have been
    better), and so is its layout group's bound; the pipeline's fill and drain tighten the busy-time bound."""
    spec = StudySpec.from_yaml(STUDIES / f"{name}.yaml")
    configs = Space(spec).configs()
    sample = random.Random(name).sample(configs, min(300, len(configs)))
    groups: dict[tuple, list] = {}
    for c in configs:
        groups.setdefault(layout_of(c), []).append(c)
    ratios, tighter = [], 0
    for c in sample:
        tps = estimate_throughput(spec, c).tokens_per_s_per_gpu
        own, busy = throughput_bound(spec, [c]), throughput_bound(spec, [c], bubble=False)
        group = throughput_bound(spec, groups[layout_of(c)])
        assert tps <= own * (1 + 1e-9), c
        assert own <= busy * (1 + 1e-12) and tps <= group * (1 + 1e-9), c
        ratios.append(tps / own)
        tighter += own < busy
    assert sorted(ratios)[len(ratios) // 2] > 0.5  # tight enough to skip most of a space
    if any(c.pp > 1 for c in sample):
        assert tighter > 0


@pytest.mark.parametrize("name", ["llama3.1-70b-h100-bf16", "qwen3-30b-a3b-h200-bf16", "local-gpt-cpu"])
def test_best_fitting_is_plans_top(name: str) -> None:
    from primus_optuna.physics.plan import best_fitting

    spec = StudySpec.from_yaml(STUDIES / f"{name}.yaml")
    result = plan_space(spec, top=1)
    best, legal, fitting = best_fitting(StudySpec.from_yaml(STUDIES / f"{name}.yaml"))  # cold caches
    assert (legal, fitting) == (result.legal_configs, result.feasible_configs)
    assert best is not None and best.config == result.top[0].config
    assert best.tokens_per_s_per_gpu == result.top[0].tokens_per_s_per_gpu
    assert best.peak_gib == result.top[0].peak_gib
