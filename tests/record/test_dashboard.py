"""optuna-dashboard's JSON API (its WSGI app on 127.0.0.1 in a thread) shows notes, user attrs, artifacts."""

from __future__ import annotations

import json
import threading
import urllib.request
from collections.abc import Iterator
from pathlib import Path
from typing import Any
from wsgiref.simple_server import WSGIRequestHandler, make_server

import optuna
import pytest
from optuna.artifacts import FileSystemArtifactStore, upload_artifact

from primus_optuna.record.dashboard import dashboard_app, note_hook, refresh_study_note, trial_note
from primus_optuna.search.suggest import suggest_config
from primus_optuna.space import Space
from tests.helpers.recorded_study import SENTINEL_KEY, small_spec


class _Quiet(WSGIRequestHandler):
    def log_message(self, *args: Any) -> None:
        pass


@pytest.fixture
def served(small_study, tmp_path: Path) -> Iterator[tuple[str, optuna.Study, Path]]:
    """The small study plus one live trial (note hook + artifact), served by optuna-dashboard."""
    storage, study = small_study
    adir = tmp_path / "small-artifacts"
    adir.mkdir(exist_ok=True)
    store = FileSystemArtifactStore(str(adir))
    spec = small_spec()
    space = Space(spec)
    study.enqueue_trial(space.canonical(space.make(tp=2, mbs=1)).to_params())
    trial = study.ask()
    suggest_config(trial, spec, space)
    first = {"phase": "planner", "proposer": "llm", "rationale": f"TP2 halves weights; key {SENTINEL_KEY}"}
    for k, v in first.items():
        trial.set_user_attr(k, v)
    note_hook(trial, first)
    second = {"estimate_tokens_per_s_per_gpu": 4321.5, "breakdown_s": {"compute": 1.25, "tp_comm": 0.5}}
    for k, v in second.items():
        trial.set_user_attr(k, v)
    note_hook(trial, second)
    log = tmp_path / "trial.log"
    log.write_text(
        f"iteration 1 | tokens/s/GPU 4000 | OPENAI_API_KEY={SENTINEL_KEY}\n".replace(SENTINEL_KEY, "***")
    )
    upload_artifact(artifact_store=store, file_path=str(log), study_or_trial=trial)
    study.tell(trial, 4300.0)
    refresh_study_note(study, storage)

    server = make_server("127.0.0.1", 0, dashboard_app(storage, adir), handler_class=_Quiet)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_port}", study, adir
    finally:
        server.shutdown()
        thread.join(5)


def _get(url: str) -> Any:
    with urllib.request.urlopen(url, timeout=10) as r:
        body = r.read()
    return json.loads(body) if body[:1] in (b"{", b"[") else body


def test_json_api_shows_notes_attrs_and_artifacts(served) -> None:
    base, study, _ = served
    summaries = _get(f"{base}/api/studies")["study_summaries"]
    assert [s["study_name"] for s in summaries] == ["small"]
    sid = summaries[0]["study_id"]
    detail = _get(f"{base}/api/studies/{sid}")
    # study note = the current summary
    note = detail["note"]["body"]
    assert "**Best**: trial 5" in note and "+15.6%" in note and "memory 1, duplicate 1" in note
    assert "tokens/s/GPU (measured, source measured); peak memory " in note  # estimate or measurement, named
    # trial note written while it ran: rationale and the step-time breakdown (second hook call kept both)
    live = detail["trials"][-1]
    assert live["number"] == 9 and live["state"] == "Complete"
    body = live["note"]["body"]
    assert live["note"]["version"] == 2
    assert "TP2 halves weights" in body and "| compute | 1.2500 |" in body and "| tp_comm | 0.5000 |" in body
    assert "4321.5" in body
    attrs = {a["key"]: a["value"] for a in live["user_attrs"]}
    assert attrs["phase"] == "planner" and attrs["config_key"] == study.trials[-1].user_attrs["config_key"]
    # study artifacts (planner transcripts) and the trial's log: listed and downloadable
    assert sorted(a["filename"] for a in detail["artifacts"]) == [
        "planner-call-5.json",
        "planner-call-7.json",
    ]
    (art,) = live["artifacts"]
    assert art["filename"] == "trial.log"
    content = _get(f"{base}/artifacts/{sid}/{live['trial_id']}/{art['artifact_id']}")
    assert b"tokens/s/GPU 4000" in content


def test_no_api_key_in_notes_or_artifacts(served) -> None:
    base, study, adir = served
    sid = _get(f"{base}/api/studies")["study_summaries"][0]["study_id"]
    detail = _get(f"{base}/api/studies/{sid}")
    notes = [detail["note"]["body"]] + [t["note"]["body"] for t in detail["trials"]]
    # the key reached a user attr (a rationale); the notes written from it are redacted
    assert any(SENTINEL_KEY in a["value"] for a in detail["trials"][-1]["user_attrs"])
    assert all(SENTINEL_KEY not in n for n in notes)
    assert "[redacted]" in detail["trials"][-1]["note"]["body"]
    for p in adir.rglob("*"):
        if p.is_file():
            assert SENTINEL_KEY.encode() not in p.read_bytes()


def test_trial_note_without_attrs() -> None:
    text = trial_note({}, None, 3)
    assert text.startswith("## Trial 3") and "estimated: -" in text


def test_study_attrs_read_as_text_not_escaped_json(served) -> None:
    base, study, _ = served
    study.set_user_attr(
        "sweep",
        {
            "centre": "tp2-pp1",
            "centre_note": "moved tp 1→2",
            "points": 4,
            "skipped": [{"axis": "ep", "value": "2"}],
        },
    )
    sid = _get(f"{base}/api/studies")["study_summaries"][0]["study_id"]
    attrs = {a["key"]: a["value"] for a in _get(f"{base}/api/studies/{sid}")["user_attrs"]}
    assert (
        attrs["sweep"]
        == "centre: tp2-pp1; centre_note: moved tp 1→2; points: 4; skipped: [{axis: ep, value: 2}]"
    )
    assert "\\u2192" not in attrs["sweep"]


def test_trial_note_log_tail_fits_the_pane() -> None:
    from primus_optuna.record.dashboard import NOTE_WIDTH

    tail = "\n".join(f"line {i} " + "x" * 300 for i in range(200))
    note = trial_note({"log_tail": tail, "rationale": "r"}, None, 1)
    block = note.split("### Log tail")[1].split("```")[1].strip("\n").splitlines()
    assert block and max(len(x) for x in block) <= NOTE_WIDTH
    assert "line 199" in note and "line 100 " not in note  # the end of the log, not all of it


def test_trial_note_prose_fits_the_pane() -> None:
    """optuna-dashboard's note pane does not wrap long lines: rationale and reasons come wrapped."""
    from primus_optuna.record.dashboard import NOTE_WIDTH

    long = " ".join(f"word{i}" for i in range(120))
    params = {"tp": 1, "pp": 4, "ep": 8, "cp": 1, "vpp": 7, "mbs": 1, "recompute": "selective:moe_act+layernorm",
              "moe_dispatcher": "deepep", "pp_schedule": "interleaved", "ep_overlap": True}  # fmt: skip
    note = trial_note({"rationale": long, "prune_reason": f"memory: {long}"}, params, 2)
    assert "word119" in note and "word0" in note
    assert max(len(x) for x in note.splitlines()) <= NOTE_WIDTH + 2  # + the Markdown line break
