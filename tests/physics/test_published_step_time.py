"""Published runs (tests/data/published-runs.csv): every expressible row within ±20% of its measured tokens/s/GPU
after one scale per (software release, GPU family), as issue 14 asks; scripts/fit_published.py prints the table.
A row the model cannot meet stays as a strict expected failure with its measured error."""

from __future__ import annotations

import pytest

from scripts.fit_published import calibrated_errors

ERRORS = calibrated_errors()
ROWS = [(key, lab, cal) for key, (_, rows) in ERRORS.items() for lab, _, _, _, cal in rows]
XFAIL = {
    # EP 64 over a 64-GPU NVLink domain with the HybridEP dispatcher, EP overlap and selective recompute:
    # +18.2% raw, +25.5% after the 26.06 Blackwell scale (the group's other rows pull the scale up by 6%)
    "GPT-OSS-120B GB200 64 mxfp8 tp1-pp1-ep64-cp1-vpp1-mbs4-selective-deepep-1f1b-epoverlap": "+25.5% after scale",
}


def test_every_group_has_rows() -> None:
    assert len(ROWS) >= 15
    assert {fam for _, fam in ERRORS} == {"hopper", "blackwell"}


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
