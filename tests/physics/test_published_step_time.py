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
    # +25.1% raw, +28.4% after the 26.06 Blackwell scale (issue 21's refit)
    "GPT-OSS-120B GB200 64 mxfp8 tp1-pp1-ep64-cp1-vpp1-mbs4-selective-deepep-1f1b-epoverlap": "+28.4% after scale",
    # GPT-OSS-120B on H100 (hidden 2880, 128 experts of 2880, top-4, attention sinks, selective recompute):
    # +28.6% raw, +25.4% after the 26.04.01 Hopper scale; the family fit (scripts/fit_published.py) holds this
    # row back and does not reach it (the same model on B200 is within 10%)
    "GPT-OSS-120B H100-SXM 64 bf16 tp1-pp4-ep8-cp1-vpp1-mbs1-selective-alltoall-1f1b": "+25.4% after scale",
    # torch FSDP2 (per-layer parameter all-gather in forward and again in backward, per-layer gradient
    # reduce-scatter) is modelled as Megatron's distributed optimizer (once per step): +39.3% raw, +21.7% after
    # the Primus CDNA3 scale
    "Llama3.1-70B MI325X 64 bf16 tp1-pp1-ep1-cp1-vpp1-mbs1-none-alltoall-1f1b": "+21.7% after scale (FSDP2)",
}


def test_every_group_has_rows() -> None:
    assert len(ROWS) >= 15
    assert {fam for _, fam in ERRORS} == {"hopper", "blackwell", "cdna3", "cdna4"}


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
