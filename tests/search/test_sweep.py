from primus_optuna import Space, StudySpec
from primus_optuna.search.sweep import sweep_plan
from primus_optuna.spec.study import AXES
from tests.conftest import small_dense_study, small_moe_study


def _diff(a, b):
    return {x for x in AXES if getattr(a, x) != getattr(b, x)}


def test_sweep_starts_at_the_baseline_and_changes_one_axis_at_a_time():
    space = Space(StudySpec.from_dict(small_moe_study(sweep_order=["mbs", "moe_dispatcher", "recompute"])))
    plan = sweep_plan(space)
    base = space.canonical(space.baseline)
    assert plan[0].config == base and plan[0].axis is None and plan[0].rationale == "baseline"
    assert [(p.axis, p.value) for p in plan[1:]] == [
        ("mbs", 2),
        ("mbs", 4),
        ("mbs", 8),
        ("moe_dispatcher", "deepep"),
        # the MoE default recompute candidates, in memory order (PP2: 16 layers per chunk, every full:N legal)
        ("recompute", "selective:moe_act"),
        ("recompute", "selective:moe_act+layernorm"),
        ("recompute", "selective:moe"),
        ("recompute", "full:1"),
        ("recompute", "full:2"),
        ("recompute", "full:4"),
        ("recompute", "full"),
    ]
    for p in plan[1:]:
        assert getattr(p.config, p.axis) == p.value
        moved = _diff(p.config, base) - {p.axis}
        assert all(f"{a} " in p.note for a in moved) and (bool(moved) == bool(p.note))
        assert not space.check(p.config) and p.config in space
    assert [p.index for p in plan] == list(range(len(plan)))


def test_default_sweep_covers_every_other_legal_value_once_and_is_deterministic():
    spec = StudySpec.from_dict(small_moe_study())
    space = Space(spec)
    plan = sweep_plan(space)
    assert plan == sweep_plan(Space(StudySpec.from_dict(small_moe_study())))
    assert len({p.config for p in plan}) == len(plan)
    base = plan[0].config
    legal = space.legal_values()
    for axis in AXES:
        swept = {p.value for p in plan if p.axis == axis}
        # every other legal value appears unless its repaired point duplicates an earlier one
        assert swept <= set(legal[axis]) - {getattr(base, axis)}
    assert {p.axis for p in plan[1:]} >= {"tp", "pp", "ep", "mbs", "recompute"}


def test_coupled_axis_is_repaired_with_a_note():
    # pp=1 forces vpp=1 and 1f1b: the sweep point moves those axes and says so
    space = Space(StudySpec.from_dict(small_dense_study()))
    plan = sweep_plan(space)
    pp1 = next(p for p in plan if p.axis == "pp" and p.value == 1)
    assert pp1.config.vpp == 1 and pp1.config.pp_schedule == "1f1b"
    zbv = next(p for p in plan if p.axis == "pp_schedule" and p.value == "zbv")
    assert zbv.config.vpp == 2 and "vpp 1→2" in zbv.note and "stay legal" in zbv.rationale


def test_default_order_puts_the_highest_expected_impact_first():
    space = Space(StudySpec.from_dict(small_moe_study()))
    impact = {"mbs": 0.5, "tp": 0.1}

    def score(c):
        return 100.0 * (1 + impact["mbs"] * (c.mbs - 1) + impact["tp"] * (c.tp - 1))

    plan = sweep_plan(space, score)
    assert plan[1].axis == "mbs"
    axes = [p.axis for p in plan[1:]]
    assert axes.index("tp") < min(axes.index(a) for a in ("ep", "recompute"))


def test_illegal_baseline_is_repaired_as_the_centre():
    spec = StudySpec.from_dict(small_moe_study(baseline={"tp": 1, "pp": 3, "ep": 4}))
    space = Space(spec)
    plan = sweep_plan(space)
    assert not space.check(plan[0].config) and "illegal" in plan[0].rationale


def test_default_order_follows_the_model_when_the_baseline_does_not_fit():
    """A baseline that does not fit in the memory model (the flagship at MBS 4 without recompute): impact is
    then measured against the median of the feasible sweep points instead of silently falling back to the
    canonical axis order."""
    from primus_optuna.physics.memory import estimate_memory
    from primus_optuna.physics.throughput import estimate_throughput
    from primus_optuna.search.sweep import axis_points, default_order, sweep_center
    from tests.conftest import FLAGSHIP

    data = StudySpec.from_yaml(FLAGSHIP).to_dict()
    data["search"]["baseline"].update(mbs=4, recompute="none")
    spec = StudySpec.from_dict(data)
    space = Space(spec)

    def score(c):
        return estimate_throughput(spec, c).tokens_per_s_per_gpu if estimate_memory(spec, c).fits else None

    center, _ = sweep_center(space)
    assert score(center) is None
    order = default_order(space, center, score)
    assert order != list(AXES)
    feasible = [v for _, c, _ in axis_points(space, center, order[0]) if (v := score(c))]
    assert feasible  # the first axis has feasible points that move the estimate
