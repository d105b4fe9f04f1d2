"""Published runs (tests/data/published-runs.csv): every expressible row within ±20% of its measured tokens/s/GPU
after one scale per (software release, GPU family), as issue 14 asks; scripts/fit_published.py prints the table.
A row the model cannot meet stays as a strict expected failure with its measured error."""

from __future__ import annotations

import pytest

from scripts.fit_published import calibrated_errors, split
from tests.helpers.published import load_published

ERRORS = calibrated_errors()
ROWS = [(key, lab, cal) for key, (_, rows) in ERRORS.items() for lab, _, _, _, cal in rows]
XFAIL = {
    # torch FSDP2 (per-layer parameter all-gather in forward and again in backward, per-layer gradient
    # reduce-scatter) is modelled as Megatron's distributed optimizer (once per step): +39.3% raw, +21.7% after
    # the Primus CDNA3 scale
    "Llama3.1-70B MI325X 64 bf16 tp1-pp1-ep1-cp1-vpp1-mbs1-none-alltoall-1f1b": "+21.7% after scale (FSDP2)",
}


def test_every_group_has_rows() -> None:
    assert len(ROWS) >= 15
    assert {fam for _, fam in ERRORS} == {"hopper", "blackwell", "blackwell_ultra", "cdna3", "cdna4"}


@pytest.mark.parametrize(
    "row",
    [
        pytest.param(
            r, id=r[1], marks=[pytest.mark.xfail(strict=True, reason=XFAIL[r[1]])] if r[1] in XFAIL else []
        )
        for r in ROWS
    ],
)
def test_row_within_20pct_after_release_family_scale(row) -> None:
    (release, family), label, cal = row
    assert abs(cal) <= 0.20, f"{release} {family} {label}: {cal:+.1%}"


def test_rows_that_joined_after_the_fit_are_only_held_back() -> None:
    """DeepSeek-V3's rows (with their pipeline layouts) joined after the constants were fitted: they are in
    no fitting part, and the alternation of the other rows is as before they joined."""
    rows = load_published()
    fit, held = split(rows)
    late = [p for p in rows if p.report_only]
    assert late and all("DeepSeek-V3" in p.label for p in late)
    assert not any(p.report_only for p in fit) and all(p in held for p in late)
    assert (fit, [p for p in held if not p.report_only]) == split([p for p in rows if not p.report_only])
    # their layouts as the rows state them (16 or 32 chunks of pp·vpp), e.g. 26.06 GB200's worded split
    gb200 = next(p for p in late if "GB200" in p.label)
    assert gb200.spec.pipeline.layout == "Et*4|(t*4|)*14tmL"


def test_fitting_one_family_keeps_the_others_and_its_borrowed_grouped_multiplier() -> None:
    """``fit_published.py --fit --family blackwell_ultra``: only that family is fitted, at NVIDIA's per-expert
    cost as it stands and Blackwell's grouped multiplier (GROUPED_FROM: the same grouped kernels), and the fit
    reproduces the shipped constants."""
    from primus_optuna.physics import calibration
    from scripts.fit_published import GROUPED_FROM, fit_families

    fit, _ = split(load_published())
    got = fit_families(fit, ("blackwell_ultra",))
    assert list(got) == ["blackwell_ultra"]
    fam, shipped = got["blackwell_ultra"], calibration.FAMILIES["blackwell_ultra"]
    assert fam.grouped_gemm_eff == calibration.FAMILIES[GROUPED_FROM["blackwell_ultra"]].grouped_gemm_eff
    assert fam.grouped_expert_us == shipped.grouped_expert_us
    assert fam.gemm.peak_fraction == shipped.gemm.peak_fraction
