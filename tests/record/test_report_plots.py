"""The report's plots are readable (#22 item 9): per-axis tick labels do not run together."""

from itertools import combinations

from primus_optuna.record.report import TrialRow, load_record
from primus_optuna.record.report.plots import axis_effects_figure
from tests.helpers.recorded_study import make_study


def test_axis_effect_tick_labels_do_not_overlap(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    make_study(url)
    rec = load_record(url, "small")
    base = rec.baseline_config
    for i, r in enumerate(
        rec.space.legal_values()["recompute"]
    ):  # every recompute value, long names included
        c = rec.space.canonical(base.replace(recompute=r, pp_schedule="1f1b"))
        rec.trials.append(TrialRow(100 + i, "COMPLETE", c, [4000.0 + 10 * i], {}))
    fig = axis_effects_figure(rec)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    checked = 0
    for ax in fig.axes:
        boxes = [lab.get_window_extent(renderer) for lab in ax.get_xticklabels() if lab.get_text()]
        for a, b in combinations(boxes, 2):
            assert not a.overlaps(b), (ax.get_title(), [lab.get_text() for lab in ax.get_xticklabels()])
        checked += len(boxes) > 4
    assert checked  # the recompute panel, with its long labels, was among them


def test_capacity_plot_has_each_gpu_type_the_deadline_and_the_pareto_front():
    import pytest

    pytest.importorskip("matplotlib")
    from primus_optuna.physics.capacity import capacity_table
    from primus_optuna.record.report.plots import plot_capacity
    from primus_optuna.spec import StudySpec
    from tests.conftest import small_dense_study

    spec = StudySpec.from_dict(small_dense_study())
    table = capacity_table(
        spec, [8, 16], ["h100", "mi300x"], tokens=1e11, days=12, prices={"h100": 2, "mi300x": 1}
    )
    svg = plot_capacity(table, fmt="svg").decode()
    for text in ("h100", "mi300x", "Pareto front", "12 days", "cost (USD)", "Days to train"):
        assert text in svg, text
    assert plot_capacity(table)[:8] == b"\x89PNG\r\n\x1a\n"
    # without a target: per 1T tokens, GPU-hours without prices
    svg = plot_capacity(capacity_table(spec, [8]), fmt="svg").decode()
    assert "per 1T tokens" in svg and "GPU-hours" in svg


def test_capacity_plot_when_nothing_fits_says_so():
    import warnings

    import pytest

    pytest.importorskip("matplotlib")
    from primus_optuna.physics.capacity import capacity_table
    from primus_optuna.record.report.plots import plot_capacity
    from primus_optuna.spec import StudySpec
    from tests.conftest import small_moe_study

    table = capacity_table(StudySpec.from_dict(small_moe_study()), [4])  # Mixtral 8x7B on 4 MI300X: no fit
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no empty legends
        svg = plot_capacity(table, fmt="svg").decode()
    assert "nothing fits at these sizes" in svg
