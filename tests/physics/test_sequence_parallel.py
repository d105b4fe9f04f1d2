"""``workload.sequence_parallel`` as a lever (issue 21 item 2): time, export, import and the space hash.

Without sequence parallelism (Korthikanti et al. 2022 §4.2; Megatron's default, Megatron-DeepSpeed) norms,
dropout and residual adds run on all tokens on every TP rank and each block all-reduces its output in forward
and its input gradient in backward. The memory side (Table 2's ``10 + 24/t``) is checked against Fig. 1 in
tests/physics/test_memory.py."""

from __future__ import annotations

import pytest

from primus_optuna.physics.throughput import estimate_throughput
from primus_optuna.record.storage import hashed_workload, space_hash
from primus_optuna.space import TrainingConfig
from primus_optuna.space.megatron_args import megatron_overrides
from primus_optuna.spec import StudySpec
from primus_optuna.spec.primus_import import workload_from_megatron
from tests.conftest import small_dense_study, small_moe_study


def _spec(sp: bool) -> StudySpec:
    data = small_dense_study()
    return StudySpec.from_dict({**data, "workload": {**data["workload"], "sequence_parallel": sp}})


def _config(spec: StudySpec, tp: int) -> TrainingConfig:
    return TrainingConfig(tp=tp, mbs=1).derive(spec.world, spec.workload.global_batch_size)


def test_default_is_on() -> None:
    assert StudySpec.from_dict(small_dense_study()).workload.sequence_parallel is True


def test_without_sequence_parallelism_tp_costs_more_time() -> None:
    on, off = _spec(True), _spec(False)
    a, b = estimate_throughput(on, _config(on, 4)), estimate_throughput(off, _config(off, 4))
    assert b.step_time_s > a.step_time_s
    # norms, residuals and dropout on all tokens: the memory-bound kernels grow
    assert b.breakdown_s["compute_other"] > a.breakdown_s["compute_other"]
    # the GEMMs are the same
    assert b.breakdown_s["compute_mlp"] == pytest.approx(a.breakdown_s["compute_mlp"])
    # TP 1: nothing to change
    one_on, one_off = estimate_throughput(on, _config(on, 1)), estimate_throughput(off, _config(off, 1))
    assert one_on.step_time_s == pytest.approx(one_off.step_time_s)


def test_exported_only_when_tp_above_one_and_on() -> None:
    """Megatron's --sequence-parallel (arguments.py@d98e8a64:1430-1439 turns it off at TP 1 anyway)."""
    on, off = _spec(True), _spec(False)
    assert megatron_overrides(on, _config(on, 2))["sequence_parallel"] is True
    assert megatron_overrides(off, _config(off, 2))["sequence_parallel"] is False
    assert megatron_overrides(on, _config(on, 1))["sequence_parallel"] is False


def test_imported_from_megatron_arguments() -> None:
    """Read when written with TP > 1 (Primus's language_model.yaml@fd1eeabb:166 writes true)."""
    tp2 = {"tensor_model_parallel_size": 2}
    assert workload_from_megatron({**tp2, "sequence_parallel": False})["sequence_parallel"] is False
    assert workload_from_megatron({**tp2, "sequence_parallel": "false"})["sequence_parallel"] is False
    assert "sequence_parallel" not in workload_from_megatron({**tp2, "sequence_parallel": True})
    assert "sequence_parallel" not in workload_from_megatron(tp2)
    # TP 1: Megatron turns it off itself (arguments.py@d98e8a64:1430-1439): nothing to import
    assert "sequence_parallel" not in workload_from_megatron({"sequence_parallel": False})


def test_enters_the_space_hash_only_when_false() -> None:
    on, off = _spec(True), _spec(False)
    assert "sequence_parallel" not in hashed_workload(on.to_dict()["workload"])
    assert space_hash(on) == space_hash(StudySpec.from_dict(small_dense_study()))
    assert space_hash(off) != space_hash(on)


def test_moe_with_tp_needs_sequence_parallelism() -> None:
    """Megatron-Core's MoE layer raises in training with tp > 1 and no sequence parallelism
    (megatron/core/transformer/moe/moe_layer.py@d98e8a64:636-640): such configurations are illegal."""
    from primus_optuna.space import Space

    data = small_moe_study()
    spec = StudySpec.from_dict({**data, "workload": {**data["workload"], "sequence_parallel": False}})
    space = Space(spec)
    reasons = space.check(space.make(tp=2, ep=1, mbs=1))
    assert any("sequence parallelism" in r for r in reasons)
    assert not any("sequence parallelism" in r for r in space.check(space.make(tp=1, ep=1, mbs=1)))
