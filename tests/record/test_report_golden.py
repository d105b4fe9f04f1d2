"""The report of a recorded study is byte-identical to a golden copy (tests/record/data/report-*.md/html).

It pins the report's text while its code is reorganised: any change to what a section writes shows here.
Only what varies between runs and machines is masked before comparing: the temporary directory in the
storage URL, the package-versions line and the base64 PNG data in the HTML (matplotlib's output depends on its
version and fonts); which plots exist is still compared.

A change to the report that is meant (a new section, a reworded line) regenerates the golden files with::

    python -m tests.record.test_report_golden

and the diff of those files is part of the change under review.
"""

from __future__ import annotations

import os
import re
from pathlib import Path

import pytest

from primus_optuna.physics.calibration import Calibration
from primus_optuna.physics.memory_calibration import MemoryCalibration
from primus_optuna.record.report import build_report
from tests.helpers.recorded_study import SENTINEL_KEY, make_study

DATA = Path(__file__).parent / "data"
VARIANTS = ("single", "pareto")

_VERSIONS = re.compile(r"Package versions \(report environment\): [^\n<]*")
_PNG = re.compile(r"data:image/png;base64,[A-Za-z0-9+/=]+")


def masked(text: str, workdir: Path) -> str:
    """The report text without what differs between runs (the work directory, package versions, PNG bytes)."""
    text = text.replace(str(workdir), "<tmp>")
    text = _VERSIONS.sub("Package versions (report environment): <versions>", text)
    return _PNG.sub("data:image/png;base64,<png>", text)


def write_report(workdir: Path, variant: str) -> dict[str, Path]:
    """The report of the recorded study (``make_study``) written under ``workdir``; the single-objective
    variant also carries both calibrations (study attrs), so every section has something to show."""
    storage = f"sqlite:///{workdir / 'small.db'}"
    study = make_study(storage, multi=variant == "pareto")
    if variant == "single":
        study.set_user_attr(
            "calibration",
            Calibration(multipliers={"compute": 1.08, "tp_comm": 0.9}, scale=0.95, n_trials=6).to_dict(),
        )
        study.set_user_attr(
            "memory_calibration", MemoryCalibration(scale=1.12, n_trials=3, n_oom=1).to_dict()
        )
    return build_report(storage, "small", workdir / "report")


def _golden(variant: str, kind: str) -> Path:
    return DATA / f"report-{variant}.{kind}"


@pytest.mark.parametrize("variant", VARIANTS)
def test_report_matches_golden(variant: str, tmp_path: Path, monkeypatch) -> None:
    monkeypatch.setenv("PRIMUS_TEST_API_KEY", SENTINEL_KEY)
    paths = write_report(tmp_path, variant)
    for kind in ("md", "html"):
        want = _golden(variant, kind).read_text()
        got = masked(paths[kind].read_text(), tmp_path)
        assert got == want, (
            f"report.{kind} of the {variant!r} study differs from {_golden(variant, kind)}; if the change is "
            "meant, regenerate with `python -m tests.record.test_report_golden` and review the diff"
        )
    plots = sorted(p.name for p in paths["plots"].iterdir())
    assert plots == sorted(re.findall(r"plots/(\w+\.png)", _golden(variant, "md").read_text()))


def regenerate() -> None:
    """Rewrite the golden files from the current code (run from the repository root)."""
    import tempfile

    os.environ["PRIMUS_TEST_API_KEY"] = SENTINEL_KEY
    DATA.mkdir(exist_ok=True)
    for variant in VARIANTS:
        with tempfile.TemporaryDirectory() as tmp:
            paths = write_report(Path(tmp), variant)
            texts = {kind: masked(paths[kind].read_text(), Path(tmp)) for kind in ("md", "html")}
        for kind, text in texts.items():
            _golden(variant, kind).write_text(text)
            print(f"wrote {_golden(variant, kind)}")


if __name__ == "__main__":
    regenerate()
