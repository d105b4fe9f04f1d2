"""A real `primus-optuna run` with the planner (LiteLLM over HTTP to a loopback server): the report shows
each round from the stored transcripts, and the API key reaches no report, note or artifact."""

from __future__ import annotations

import json
from pathlib import Path

import optuna
import pytest
import yaml
from click.testing import CliRunner
from optuna_dashboard import get_note

from primus_optuna.cli import cli
from primus_optuna.record.report import build_report
from primus_optuna.spec import StudySpec
from tests.conftest import small_moe_study
from tests.helpers.openai_server import OpenAIServer

pytest.importorskip("primus_optuna.physics.throughput")

SENTINEL = "sk-sentinel-REPORT-0123456789"


def _reply(candidates: list[dict]) -> str:
    """An assistant message in DSPy's ChatAdapter format."""
    return (
        f"[[ ## reasoning ## ]]\nmix the sweep winners\n\n[[ ## candidates ## ]]\n{json.dumps(candidates)}\n\n"
        "[[ ## completed ## ]]"
    )


def test_planner_rounds_in_report_and_no_key_anywhere(tmp_path: Path, monkeypatch) -> None:
    from primus_optuna.physics.memory import estimate_memory
    from primus_optuna.physics.throughput import estimate_throughput
    from primus_optuna.search.sampler import PrimusSampler
    from primus_optuna.space import Space

    monkeypatch.setenv("PRIMUS_TEST_API_KEY", SENTINEL)
    data = small_moe_study(sweep_order=["mbs"])
    data["llm"] = {
        "model": "openai/test-model",
        "api_key_env": "PRIMUS_TEST_API_KEY",
        "num_retries": 0,
        "timeout_s": 5,
        "max_calls": 1,
        "mode": "oneshot",
    }
    spec = StudySpec.from_dict(data)
    plan = PrimusSampler(spec).plan
    swept = {p.config for p in plan}
    space = Space(spec)
    fits = [c for c in space.configs() if c not in swept and estimate_memory(spec, c).fits]
    fits.sort(key=lambda c: -estimate_throughput(spec, c).tokens_per_s_per_gpu)  # launched only if worth it
    cands = [
        {**fits[0].to_params(), "rationale": f"good one (echoing {SENTINEL})"},
        {**fits[0].to_params(), "tp": 3, "rationale": "odd tensor parallelism"},
    ]
    study_file = tmp_path / "study.yaml"
    study_file.write_text(yaml.safe_dump(data))
    storage = f"sqlite:///{tmp_path / 'llm.db'}"
    with OpenAIServer([_reply(cands)]) as srv:
        r = CliRunner().invoke(
            cli,
            ["run", str(study_file), "--storage", storage, "--n-trials", str(len(plan) + 2)]
            + ["--llm-api-base", srv.url, "--no-progress"],
        )
    assert r.exit_code == 0, r.output
    out = tmp_path / "report"
    md = build_report(storage, None, out)["md"].read_text()
    study = optuna.load_study(study_name="small-moe", storage=storage)
    first_planner = next(t for t in study.trials if t.user_attrs.get("phase") == "planner")
    assert f"### Round 1 (before trial {first_planner.number}, openai/test-model)" in md
    assert "1 accepted, 1 rejected" in md
    assert "| rejected | illegal: " in md and "odd tensor parallelism" in md
    assert "good one (echoing [redacted])" in md
    assert "Fallback trials by reason: llm.max_calls=1 reached: 1." in md
    share = first_planner.user_attrs["expected_share_of_best"]
    assert f"Planner launches: 1, expected at {share:.0%} of the best when the gate let them through" in md
    # the key: in no report file, no note, no artifact
    for p in out.rglob("*"):
        if p.is_file():
            assert SENTINEL.encode() not in p.read_bytes(), p
    notes = [get_note(study)] + [get_note(optuna.trial.Trial(study, t._trial_id)) for t in study.trials]
    assert all(SENTINEL not in n for n in notes)
    assert "good one (echoing [redacted])" in "".join(notes)
    artifacts = [p for p in (tmp_path / "llm-artifacts").rglob("*") if p.is_file()]
    assert artifacts
    for p in artifacts:
        assert SENTINEL.encode() not in p.read_bytes(), p
    # nor the storage file itself: the rationale the LM echoed the key in is redacted before it is stored
    assert SENTINEL.encode() not in (tmp_path / "llm.db").read_bytes()
    assert first_planner.user_attrs["rationale"].startswith("good one (echoing [redacted]) [expected ")
