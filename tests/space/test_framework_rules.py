"""Legality rules that live only in Primus (not in Megatron-Core's config classes, so the CI framework check
in tests/mcore cannot catch them): each case names its source line."""

from __future__ import annotations

import pytest

from primus_optuna import Space, StudySpec
from tests.conftest import FLAGSHIP, STUDIES

FRAMEWORK_RULES = (
    "zb_pipeline",
    "zb_requirements",
    "sync_free_tp",
    "zb_op_fuser",
    "zb_upstream",
    "deepep_ep",
    "tp_comm_overlap_sp",
)
"""The rule ids these tests cover (tests/space/test_rules.py checks every rule is covered somewhere)."""


def _space(**sections: dict) -> Space:
    data = StudySpec.from_yaml(FLAGSHIP).to_dict()  # Mixtral 8x22B (56 layers), 64 MI355X
    for key, value in sections.items():
        data[key] = {**data.get(key, {}), **value} if key != "pipeline" else value
    return Space(StudySpec.from_dict(data))


ZB1P = dict(tp=1, pp=4, vpp=1, ep=8, mbs=1, recompute="none", pp_schedule="zb1p")
ZBV = {**ZB1P, "vpp": 2, "pp_schedule": "zbv"}


@pytest.mark.parametrize(
    ("pipeline", "what"),
    [
        ({"layout": "Et*14|t*14|t*14|t*14L"}, "pipeline.layout"),
        ({"decoder_first_pipeline_num_layers": 11, "decoder_last_pipeline_num_layers": 15}, "uneven"),
    ],
)
def test_zero_bubble_is_illegal_with_a_layout_or_an_uneven_split(pipeline: dict, what: str) -> None:
    """Primus's zero-bubble schedules split the layers evenly themselves
    (primus/backends/megatron/core/pipeline_parallel/zerobubble/zbpp_utils.py@fd1eeabb:149-160;
    zerobubble/scheduler/communication.py@fd1eeabb:288-292): with a layout or a first/last-stage split they
    are not the pipeline the estimate describes."""
    space = _space(pipeline=pipeline)
    one = space.make(**{**ZB1P, "pp_schedule": "1f1b"})
    assert space.check(one) == []  # the split itself is legal with 1F1B
    reasons = space.check(space.make(**ZB1P))
    assert any("zero bubble" in r and what in r for r in reasons), reasons
    assert all(c.pp_schedule not in ("zb1p", "zbv") for c in space.configs())
    assert _space().check(_space().make(**ZB1P)) == [] and _space().check(_space().make(**ZBV)) == []


def test_zero_bubble_needs_gradient_accumulation_fusion() -> None:
    """Primus's zero bubble requires gradient_accumulation_fusion: true
    (primus/backends/megatron/core/pipeline_parallel/zerobubble/README.md@fd1eeabb:14-20)."""
    space = _space(workload={"gradient_accumulation_fusion": False})
    for axes in (ZB1P, ZBV):
        reasons = space.check(space.make(**axes))
        assert any("gradient accumulation fusion" in r for r in reasons), reasons
    assert space.check(space.make(**{**ZB1P, "pp_schedule": "1f1b"})) == []


def test_sync_free_moe_needs_tp_1() -> None:
    """Sync-free MoE stage 2 enables Primus-Turbo's grouped GEMM
    (primus/backends/megatron/patches/args/rocm_arg_validation.py@fd1eeabb:55-61,199-206), whose layers assert
    tensor parallel size 1 (primus/backends/megatron/core/extensions/primus_turbo.py@fd1eeabb:2024)."""
    space = _space(workload={"moe_sync_free": True})
    base = dict(pp=4, vpp=2, ep=8, mbs=1, pp_schedule="interleaved")
    assert space.check(space.make(**base, tp=1, moe_dispatcher="deepep")) == []
    reasons = space.check(space.make(**base, tp=2, moe_dispatcher="deepep"))
    assert any("moe_sync_free" in r and "tp=1" in r for r in reasons), reasons
    assert space.check(space.make(**base, tp=2, moe_dispatcher="alltoall")) == []  # no sync-free path
    assert _space().check(_space().make(**base, tp=2, moe_dispatcher="deepep")) == []


def test_an_nvidia_study_offers_only_the_schedules_upstream_megatron_runs() -> None:
    """Zero bubble is Primus's (AMD GPUs); upstream Megatron-LM has 1F1B and interleaved
    (megatron/core/pipeline_parallel/schedules.py@d98e8a64:53 get_forward_backward_func)."""
    for path in ("gpt-oss-120b-h100-bf16.yaml", "llama3.1-70b-h100-bf16.yaml"):
        space = Space(StudySpec.from_yaml(FLAGSHIP.parent / path))
        assert space.candidates["pp_schedule"] == ["1f1b", "interleaved"]
        assert {c.pp_schedule for c in space.configs()} <= {"1f1b", "interleaved"}
    assert "zbv" in Space(StudySpec.from_yaml(FLAGSHIP)).candidates["pp_schedule"]


def test_zero_bubble_cannot_run_the_te_op_fuser() -> None:
    """The zero-bubble schedules exist only in Primus, whose pinned Megatron-LM (d3528a21) has no
    use_transformer_engine_op_fuser (upstream: megatron/core/transformer/transformer_config.py@d98e8a64:525-527):
    with workload.te_op_fuser (an NVIDIA study) they leave the space, 1F1B stays."""
    space = _space(cluster={"gpu": "b200"}, workload={"te_op_fuser": True})
    for axes in (ZB1P, ZBV):
        reasons = space.check(space.make(**axes))
        assert any("workload.te_op_fuser" in r and "zero bubble" in r for r in reasons), reasons
    assert space.check(space.make(**{**ZB1P, "pp_schedule": "1f1b"})) == []
    assert all(c.pp_schedule not in ("zb1p", "zbv") for c in space.configs())
    off = _space(cluster={"gpu": "b200"})
    assert off.check(off.make(**ZB1P)) == []


def test_zero_bubble_is_illegal_under_the_megatron_runner_only() -> None:
    """Upstream Megatron-LM has no zero-bubble argument (megatron/training/arguments.py@d98e8a64); the megatron
    runner launches it, so zb1p/zbv cannot run there, while Primus (and the analytical estimate) can."""
    opts = {"megatron_path": "/opt/Megatron-LM", "hosts": [f"n{i}" for i in range(8)]}
    for runner in (
        {"kind": "megatron", "options": opts},
        {"kind": "slurm", "options": {"preset": "megatron"}},
    ):
        space = _space(runner=runner)
        for cfg in (ZB1P, ZBV):
            reasons = space.check(space.make(**cfg))
            assert any("does not exist in upstream Megatron-LM" in r for r in reasons), (runner, reasons)
        assert not space.check(space.make(**{**ZB1P, "pp_schedule": "1f1b"}))
    for runner in ({"kind": "analytical"}, {"kind": "primus", "options": {}}):
        space = _space(runner=runner)
        assert not space.check(space.make(**ZB1P)) and not space.check(space.make(**ZBV))


def test_deepep_needs_more_than_one_rank_in_the_expert_tp_x_ep_group() -> None:
    """Megatron-Core's flex dispatcher asserts expert-TP x EP > 1 when the MoE layer is built
    (megatron/core/transformer/moe/token_dispatcher.py@d98e8a64:1836; @d3528a21:1359, Primus's pin, for every
    flex backend; Primus-Turbo's DeepEP dispatcher raises the same, primus/backends/megatron/core/extensions/
    primus_turbo.py@fd1eeabb:2320-2321). Its "tp" is the expert TP group (token_dispatcher.py@d98e8a64:86,89),
    which the export sets to 1: tp=2 at ep=1 is refused as well, alltoall at ep=1 is not."""
    space = _space()
    base = dict(pp=4, vpp=2, mbs=1, pp_schedule="interleaved", recompute="none")
    for tp in (1, 2):
        reasons = space.check(space.make(**base, tp=tp, ep=1, moe_dispatcher="deepep"))
        assert any("deepep needs ep > 1" in r and "token_dispatcher.py@d98e8a64:1836" in r for r in reasons)
        assert space.check(space.make(**base, tp=tp, ep=1, moe_dispatcher="alltoall")) == []
        assert space.check(space.make(**base, tp=tp, ep=2, moe_dispatcher="deepep")) == []
    for path in sorted(STUDIES.glob("*.yaml")):
        configs = Space(StudySpec.from_yaml(path)).configs()
        assert not [c for c in configs if c.moe_dispatcher == "deepep" and c.ep == 1], path.name


def test_tp_comm_overlap_needs_sequence_parallelism_when_tp_is_above_1() -> None:
    """Megatron-LM's validate_args asserts sequence parallelism with --tp-comm-overlap
    (megatron/training/arguments.py@d98e8a64:1441-1442, @d3528a21:1153-1154); the export writes the flag only
    when tp > 1, so tp = 1 stays legal."""
    dense = StudySpec.from_yaml(STUDIES / "llama3.1-70b-h100-bf16.yaml").to_dict()
    dense["workload"] = {**dense["workload"], "tp_comm_overlap": True, "sequence_parallel": False}
    space = Space(StudySpec.from_dict(dense))
    base = dict(pp=8, vpp=1, mbs=1, pp_schedule="1f1b", recompute="full")
    reasons = space.check(space.make(**base, tp=4))
    assert any(
        "tp_comm_overlap needs sequence parallelism" in r and "arguments.py@d98e8a64:1442" in r
        for r in reasons
    )
    assert space.check(space.make(**base, tp=1)) == []
    assert {c.tp for c in space.configs()} == {1}
    dense["workload"]["sequence_parallel"] = True
    on = Space(StudySpec.from_dict(dense))
    assert on.check(on.make(**base, tp=4)) == []
