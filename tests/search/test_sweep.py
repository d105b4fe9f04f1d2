from primus_optuna import Space, StudySpec
from primus_optuna.physics.memory import estimate_memory
from primus_optuna.physics.throughput import estimate_throughput
from primus_optuna.search.sweep import (
    MEMORY_LEVERS,
    SWEEP_SHARE,
    sweep_budget,
    sweep_design,
    sweep_plan,
)
from primus_optuna.spec.study import AXES
from tests.conftest import small_dense_study, small_moe_study


def _score_of(data):
    spec = StudySpec.from_dict(data)

    def score(c):
        return estimate_throughput(spec, c).tokens_per_s_per_gpu if estimate_memory(spec, c).fits else None

    return score


def _estimate_objective(spec, space):
    """A plain objective whose value (a measurement, to the sampler) is the step-time model's estimate."""
    import optuna

    from primus_optuna.search.suggest import suggest_config

    def objective(trial):
        config = suggest_config(trial, spec, space)
        if trial.should_prune():
            raise optuna.TrialPruned()
        return estimate_throughput(spec, config).tokens_per_s_per_gpu

    return objective


def _diff(a, b):
    return {x for x in AXES if getattr(a, x) != getattr(b, x)}


def test_sweep_starts_at_the_baseline_and_changes_one_axis_at_a_time():
    space = Space(
        StudySpec.from_dict(
            small_moe_study(sweep_order=["mbs", "moe_dispatcher", "recompute"], sweep_trials=12)
        )
    )
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


def test_every_other_legal_value_is_swept_or_skipped_with_a_reason_and_the_plan_is_deterministic():
    spec = StudySpec.from_dict(small_moe_study(sweep_trials=40))
    space = Space(spec)
    design = sweep_design(space)
    assert design.points == sweep_design(Space(StudySpec.from_dict(small_moe_study(sweep_trials=40)))).points
    plan = design.points
    assert len({p.config for p in plan}) == len(plan)
    base = plan[0].config
    legal = space.legal_values()
    for axis in AXES:
        swept = {p.value for p in plan if p.axis == axis}
        skipped = {s.value for s in design.skipped if s.axis == axis}
        assert swept <= set(legal[axis]) - {getattr(base, axis)}
        assert not swept & skipped
    assert all(s.reason for s in design.skipped)
    assert {p.axis for p in plan[1:]} >= {"tp", "pp", "ep", "mbs", "recompute"}


def test_the_sweep_fits_its_budget_and_a_longer_one_extends_a_shorter_one():
    def design(**kw):
        return sweep_design(
            Space(StudySpec.from_dict(small_moe_study(**kw))), _score_of(small_moe_study(**kw))
        )

    short, long = design(sweep_trials=4), design(sweep_trials=9)
    assert len(short.points) == 4 and len(long.points) == 9
    assert long.points[:4] == short.points
    assert any("beyond the sweep budget of 4" in s.reason for s in short.skipped)
    # default: a share of n_trials
    assert len(design(n_trials=30).points) == sweep_budget(Space(StudySpec.from_dict(small_moe_study())))
    assert len(design(n_trials=50).points) == int(50 * SWEEP_SHARE)


def test_coupled_axis_is_repaired_with_a_note():
    # pp=1 forces vpp=1 and 1f1b: the sweep point moves those axes and says so (zbv asked for explicitly: an
    # NVIDIA study's default schedules are upstream Megatron-LM's)
    axes = {"pp_schedule": ["1f1b", "interleaved", "zb1p", "zbv"]}
    space = Space(StudySpec.from_dict(small_dense_study(sweep_trials=40, axes=axes)))
    plan = sweep_plan(space)
    pp1 = next(p for p in plan if p.axis == "pp" and p.value == 1)
    assert pp1.config.vpp == 1 and pp1.config.pp_schedule == "1f1b"
    zbv = next(p for p in plan if p.axis == "pp_schedule" and p.value == "zbv")
    assert zbv.config.vpp == 2 and "vpp 1→2" in zbv.note and "stay legal" in zbv.rationale


def test_default_order_puts_the_highest_expected_impact_first():
    space = Space(StudySpec.from_dict(small_moe_study(sweep_trials=40, start="baseline")))
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


def _unfit_flagship():
    """The flagship study with its baseline's micro-batch raised until it does not fit (whatever the shipped
    baseline is)."""
    from tests.conftest import FLAGSHIP

    spec = StudySpec.from_yaml(FLAGSHIP)
    for mbs in Space(spec).candidates["mbs"]:
        base = spec.search.baseline.model_copy(update={"mbs": mbs})
        s2 = spec.model_copy(update={"search": spec.search.model_copy(update={"baseline": base})})
        sp = Space(s2)
        if (
            not sp.check(sp.canonical(sp.baseline))
            and not estimate_memory(s2, sp.canonical(sp.baseline)).fits
        ):
            return s2
    raise AssertionError("no micro-batch makes the flagship baseline not fit")


def test_a_baseline_that_does_not_fit_is_swept_around_the_nearest_fitting_centre():
    """Issue 15: the sweep is centred on a configuration that fits, moved by memory levers when they suffice,
    and at most three of the flagship's sweep points are memory-pruned."""
    from primus_optuna.search.sampler import PrimusSampler

    spec = _unfit_flagship()
    space = Space(spec)
    sampler = PrimusSampler(spec)
    design = sampler.design
    centre = design.centre
    base = space.canonical(space.baseline)
    assert estimate_memory(spec, centre).fits and not estimate_memory(spec, base).fits
    assert "does not fit in memory" in design.centre_note and "moved" in design.centre_note
    moved = {a for a in AXES if getattr(centre, a) != getattr(base, a)}
    assert moved and all(f"{a} " in design.centre_note for a in moved)
    # a memory-lever-only fix exists for this baseline (the mbs it had before), so no parallel axis moved
    lever_fix = any(
        estimate_memory(spec, c).fits
        for c in space.configs()
        if all(getattr(c, a) == getattr(base, a) for a in AXES if a not in MEMORY_LEVERS)
    )
    assert lever_fix and moved <= set(MEMORY_LEVERS)
    pruned = [p for p in design.points if not estimate_memory(spec, p.config).fits]
    assert len(pruned) <= 3
    for p in design.points[1:]:
        assert getattr(p.config, p.axis) == p.value and not space.check(p.config)
        if "to fit in memory" in p.rationale:
            assert estimate_memory(spec, p.config).fits
    # and in a study: the first trials are those points, launched (not pruned) except the documented ones
    import optuna

    from primus_optuna.search.pruner import MemoryPrefilterPruner

    study = optuna.create_study(
        direction="maximize", sampler=sampler, pruner=MemoryPrefilterPruner(spec=spec)
    )
    study.optimize(_estimate_objective(spec, space), n_trials=len(design.points))
    states = [t.state for t in study.trials]
    assert states.count(optuna.trial.TrialState.PRUNED) == len(pruned) <= 3
    assert study.user_attrs["sweep"]["centre"] == centre.key()
    assert study.user_attrs["sweep"]["skipped"]


def test_once_measured_the_sweep_skips_points_the_model_knows_are_worse():
    """A measured study (a plain objective: its values are measurements) whose sweep would spend its trials on
    micro-batch sizes the model puts at 40% of its best (confidently worse: upper bounds below 80%): the
    corrected model's own pick runs instead."""
    import optuna

    from primus_optuna.search.pruner import MemoryPrefilterPruner
    from primus_optuna.search.sampler import PrimusSampler

    spec = StudySpec.from_dict(small_moe_study(sweep_order=["mbs"]))
    space = Space(spec)
    sampler = PrimusSampler(spec, seed=0)
    top = max(r.estimate.tokens_per_s_per_gpu for r in sampler.fallback.rows())
    plan = sampler.plan
    worse = [
        p.config for p in plan[1:] if estimate_throughput(spec, p.config).tokens_per_s_per_gpu < 0.5 * top
    ]
    assert len(worse) >= 2  # the premise: the planned sweep holds points far below the model's best

    study = optuna.create_study(
        direction="maximize", sampler=sampler, pruner=MemoryPrefilterPruner(spec=spec)
    )
    study.optimize(_estimate_objective(spec, space), n_trials=len(plan))
    ran = [space.canonical(space.make(**t.params)) for t in study.trials]
    assert ran[0] == plan[0].config  # the centre first, as planned
    assert not set(worse) & set(ran)
    assert study.best_value >= 0.99 * top  # the trials went to the model's best instead


def test_without_measurements_the_sweep_runs_as_planned():
    import optuna

    from primus_optuna.run.objective import make_objective
    from primus_optuna.search.pruner import MemoryPrefilterPruner
    from primus_optuna.search.sampler import PrimusSampler

    spec = StudySpec.from_dict(small_moe_study(sweep_order=["mbs"]))
    sampler = PrimusSampler(spec, seed=0)
    plan = sampler.plan
    study = optuna.create_study(
        direction="maximize", sampler=sampler, pruner=MemoryPrefilterPruner(spec=spec)
    )
    study.optimize(make_objective(spec), n_trials=len(plan))  # the analytical runner: nothing is measured
    assert [t.user_attrs["config_key"] for t in study.trials] == [p.config.key() for p in plan]


def test_once_the_centre_is_measured_the_models_own_pick_runs_before_one_axis_moves_it_ranks_lower():
    """Issue 41 item 6: a measured study (a plain objective at the model's own figures) with the default
    sweep: the centre first, then the model's best instead of one-axis points outside the fallback's few best by
    expected improvement (the passed-over point named), so the search is never behind measuring the model's
    own top k."""
    import optuna

    from primus_optuna.search.pruner import MemoryPrefilterPruner
    from primus_optuna.search.sampler import PrimusSampler

    spec = StudySpec.from_dict(small_moe_study())
    space = Space(spec)
    sampler = PrimusSampler(spec, seed=0)
    top = sorted((r.estimate.tokens_per_s_per_gpu for r in sampler.fallback.rows()), reverse=True)
    study = optuna.create_study(
        direction="maximize", sampler=sampler, pruner=MemoryPrefilterPruner(spec=spec)
    )
    study.optimize(_estimate_objective(spec, space), n_trials=len(sampler.plan))
    first, second = study.trials[:2]
    assert first.user_attrs["sweep_axis"] == "baseline"
    assert second.system_attrs["primus:proposal"]["phase"] == "fallback"  # recorded when decided
    assert (
        "sweep: no remaining point is the best by expected improvement (the best, "
        in (second.user_attrs["rationale"])
    )
    for k in range(1, len(sampler.plan)):  # never behind measuring the model's top k (after the centre)
        assert max(t.value for t in study.trials[: k + 1]) >= max(top[:k]) * (1 - 1e-9)


def test_a_study_that_sets_its_sweep_runs_it_in_the_plans_order_once_measured():
    """``search.sweep_trials`` set: the user's sweep runs as planned in a measured study too (only points the
    model is confident are worse would be left out)."""
    import optuna

    from primus_optuna.search.pruner import MemoryPrefilterPruner
    from primus_optuna.search.sampler import PrimusSampler

    spec = StudySpec.from_dict(small_moe_study(sweep_trials=4))
    space = Space(spec)
    sampler = PrimusSampler(spec, seed=0)
    study = optuna.create_study(
        direction="maximize", sampler=sampler, pruner=MemoryPrefilterPruner(spec=spec)
    )
    study.optimize(_estimate_objective(spec, space), n_trials=len(sampler.plan))
    assert [t.user_attrs["config_key"] for t in study.trials] == [p.config.key() for p in sampler.plan]
    assert all(t.user_attrs["phase"] == "sweep" for t in study.trials)


def test_start_auto_keeps_the_baseline_when_the_gain_is_inside_the_ratio_band():
    """``search.start: auto`` moves the centre only when the model's best beats the baseline by more than the
    error band of a ratio of two estimates (one node: ±18%, the held-back vTrain pairs)."""
    from primus_optuna.physics.uncertainty import gain_inside_band, ratio_band

    data = small_dense_study()
    spec = StudySpec.from_dict(data)
    space = Space(spec)
    score = _score_of(data)
    base = score(space.canonical(space.baseline))
    top = max(s for c in space.configs() if (s := score(c)))
    band = ratio_band(spec)
    design = sweep_design(space, score)
    if gain_inside_band(top / base - 1, band):
        assert design.centre == space.canonical(space.baseline) and not design.points[0].from_model
    else:
        assert score(design.centre) == top and design.points[0].from_model
        assert "the model's best, estimated" in design.start["note"] and band.text() in design.start["note"]

    def flat(c):  # every configuration within 5% of the baseline: no confidence to move
        s = score(c)
        return None if s is None else base * (1 + 0.05 * (s > base))

    centre = sweep_design(space, flat).centre
    assert centre == space.canonical(space.baseline)

    def steep(c):  # the model's best 3x the baseline: beyond any band
        s = score(c)
        return None if s is None else s * (3.0 if s == top else 1.0)

    moved = sweep_design(space, steep)
    assert score(moved.centre) == top and moved.points[0].rationale.startswith(
        "sweep centre (the model's best"
    )
    assert "search.start: baseline begins at the baseline" in moved.start["note"]
    assert moved.start["baseline_estimate"] and moved.start["centre_estimate"] == steep(moved.centre)
    # every other point is a one-axis move around the new centre
    assert all(len(_diff(moved.centre, p.config)) >= 1 for p in moved.points[1:])


def test_start_baseline_and_model_override_the_rule():
    data = small_dense_study()
    score = _score_of(data)

    def steep(c):
        s = score(c)
        return None if s is None else s * (3.0 if c.mbs == 2 and c.tp == 1 else 1.0)

    base_space = Space(StudySpec.from_dict(small_dense_study(start="baseline")))
    assert sweep_design(base_space, steep).centre == base_space.canonical(base_space.baseline)
    model_space = Space(StudySpec.from_dict(small_dense_study(start="model")))
    top = max(s for c in model_space.configs() if (s := score(c)))
    d = sweep_design(model_space, score)
    assert score(d.centre) == top and "search.start: model" in d.start["note"]


def test_start_auto_keeps_older_hashes_and_other_values_change_them():
    from primus_optuna.search.state import space_hash

    plain = space_hash(StudySpec.from_dict(small_dense_study()))
    assert space_hash(StudySpec.from_dict(small_dense_study(start="auto"))) == plain
    assert space_hash(StudySpec.from_dict(small_dense_study(start="model"))) != plain


def test_a_centre_that_gives_no_value_turns_the_sweep_to_the_models_order():
    """The centre is pruned (e.g. by a memory check the model missed): the one-axis moves lost their reference,
    so the next trials follow the model by value rather than the plan's impact order."""
    import optuna

    from primus_optuna.search.pruner import MemoryPrefilterPruner
    from primus_optuna.search.sampler import PrimusSampler
    from primus_optuna.search.suggest import suggest_config

    spec = StudySpec.from_dict(small_moe_study(start="baseline"))
    space = Space(spec)
    sampler = PrimusSampler(spec, seed=0)
    centre = sampler.plan[0].config
    top = sorted((r.estimate.tokens_per_s_per_gpu for r in sampler.fallback.rows()), reverse=True)

    def objective(trial):
        config = suggest_config(trial, spec, space)
        if config == centre:
            raise optuna.TrialPruned("the centre ran out of memory")
        return estimate_throughput(spec, config).tokens_per_s_per_gpu

    study = optuna.create_study(
        direction="maximize", sampler=sampler, pruner=MemoryPrefilterPruner(spec=spec)
    )
    study.optimize(objective, n_trials=4)
    assert study.trials[0].state == optuna.trial.TrialState.PRUNED
    values = [t.value for t in study.trials[1:]]
    assert values[0] >= top[0] * (1 - 1e-9)  # the model's best next, not the plan's first one-axis move


def test_start_auto_keeps_the_baseline_of_a_pareto_study():
    data = small_dense_study(objective=["tokens_per_s_per_gpu", "peak_memory_gib"])
    score = _score_of(data)

    def steep(c):
        s = score(c)
        return None if s is None else s * (3.0 if c.mbs == 2 and c.tp == 1 else 1.0)

    space = Space(StudySpec.from_dict(data))
    assert sweep_design(space, steep).start is None
    single = Space(StudySpec.from_dict(small_dense_study()))
    assert sweep_design(single, steep).start is not None  # the same scores move a single-objective study
