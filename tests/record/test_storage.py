import os

import optuna
import pytest

from primus_optuna import SpecError, StudySpec
from primus_optuna.record.storage import (
    default_storage_url,
    hashed_workload,
    make_storage,
    normalize_url,
    open_study,
    space_hash,
    storage_file,
)
from primus_optuna.redaction import redact_url
from primus_optuna.spec.study import PRECISION_AWARE_FIELDS
from tests.conftest import small_moe_study

optuna.logging.set_verbosity(optuna.logging.WARNING)


def _spec(**search):
    return StudySpec.from_dict(small_moe_study(**search))


def test_urls_and_sibling_directories(tmp_path):
    spec = _spec()
    assert default_storage_url(spec) == "sqlite:///small-moe.db"
    assert normalize_url("runs/x.db") == "sqlite:///runs/x.db"
    assert normalize_url("runs/x.log") == "journal:runs/x.log"
    assert storage_file("sqlite:////abs/s.db").as_posix() == "/abs/s.db"
    assert storage_file("postgresql://u:p@h/db") is None
    assert redact_url("postgresql://user:pw@host/db") == "postgresql://user:***@host/db"
    handle = open_study(spec, storage=f"sqlite:///{tmp_path / 'a.db'}")
    assert handle.created and handle.artifact_dir == tmp_path / "a-artifacts" and handle.artifact_dir.is_dir()
    assert handle.runs_dir == tmp_path / "a-runs" and handle.cache_dir == tmp_path / "a-dspy-cache"
    study = handle.study
    assert study.directions == [optuna.study.StudyDirection.MAXIMIZE]
    # the study file is a system attr (the dashboard lists user attrs: a one-line summary there)
    from primus_optuna.search.state import SPEC, stored_spec_data

    assert stored_spec_data(study) == spec.to_dict() and "primus_spec" not in study.user_attrs
    assert study._storage.get_study_system_attrs(study._study_id)[SPEC] == spec.to_dict()
    assert study.user_attrs["primus_study"].startswith(f"{spec.model.name} on 2x4 ")
    assert study.user_attrs["primus_space_hash"] == space_hash(spec)
    assert study.metric_names == ["tokens_per_s_per_gpu"]  # a column name a user can type


def test_default_storage_is_a_sqlite_file_in_the_working_directory(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    handle = open_study(_spec())
    assert (tmp_path / "small-moe.db").is_file() and handle.storage_url == "sqlite:///small-moe.db"


def test_resume_keeps_trials_and_accepts_non_space_edits(tmp_path):
    url = f"sqlite:///{tmp_path / 's.db'}"
    spec = _spec()
    first = open_study(spec, storage=url)
    first.study.enqueue_trial({"tp": 1})
    edited = StudySpec.from_dict(
        {**small_moe_study(n_trials=99), "llm": {"model": "openai/x", "max_calls": 2}}
    )
    again = open_study(edited, storage=url)
    assert not again.created and len(again.study.trials) == 1
    assert space_hash(edited) == space_hash(spec)


def test_precision_aware_optimizer_enters_the_space_hash_only_when_set():
    """It changes the memory estimate, so it changes the hash; left at fp32 it is absent from the hashed
    document, so study files written before the fields existed keep their hash."""
    data = small_moe_study()
    pao = {"precision_aware_optimizer": True, "exp_avg_dtype": "bf16", "exp_avg_sq_dtype": "bf16"}
    lean = StudySpec.from_dict({**data, "workload": {**data["workload"], **pao}})
    assert space_hash(lean) != space_hash(_spec())
    off = StudySpec.from_dict({**data, "workload": {**data["workload"], "precision_aware_optimizer": True}})
    assert space_hash(off) != space_hash(_spec()) != space_hash(lean) != space_hash(off)
    hashed = hashed_workload(_spec().to_dict()["workload"])
    assert not set(hashed) & set(PRECISION_AWARE_FIELDS) and "grad_reduce_in_fp32" in hashed
    assert hashed_workload(lean.to_dict()["workload"])["exp_avg_dtype"] == "bf16"


@pytest.mark.parametrize(
    "edit",
    [
        {"axes": {"mbs": [1, 2]}},
        {"baseline": {"tp": 2, "pp": 2, "ep": 4}},
        {"objective": ["tokens_per_s_per_gpu", "peak_memory_gib"]},
    ],
    ids=["axes", "baseline", "objectives"],
)
def test_resuming_a_study_whose_space_changed_is_refused(tmp_path, edit):
    url = f"sqlite:///{tmp_path / 's.db'}"
    open_study(_spec(), storage=url)
    with pytest.raises(SpecError, match="edited between runs in a way that changes the space"):
        open_study(_spec(**edit), storage=url)


def test_heartbeat_and_journal_storages(tmp_path):
    rdb = make_storage(f"sqlite:///{tmp_path / 'h.db'}", heartbeat_interval=5, grace_period=10)
    assert rdb.get_heartbeat_interval() == 5
    assert isinstance(
        rdb.get_heartbeat_stale_trial_callback(), optuna.storages.RetryHeartbeatStaleTrialCallback
    )
    handle = open_study(_spec(), storage=str(tmp_path / "j.log"))
    assert isinstance(handle.study._storage, optuna.storages.JournalStorage)
    assert handle.artifact_dir == tmp_path / "j-artifacts"
    assert open_study(_spec(), storage=str(tmp_path / "j.log")).created is False


def test_bad_storage_url_is_a_user_error(tmp_path):
    with pytest.raises(SpecError, match="--storage"):
        open_study(_spec(), storage="nosuchdb://x/y")


@pytest.mark.postgres
@pytest.mark.skipif(not os.environ.get("PRIMUS_OPTUNA_PG_URL"), reason="PRIMUS_OPTUNA_PG_URL is not set")
def test_postgresql_storage(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    name = f"pg-{os.getpid()}-{tmp_path.name}"
    handle = open_study(_spec(), storage=os.environ["PRIMUS_OPTUNA_PG_URL"], study_name=name)
    assert handle.created and handle.artifact_dir.resolve() == (tmp_path / f"{name}-artifacts").resolve()
    assert open_study(_spec(), storage=os.environ["PRIMUS_OPTUNA_PG_URL"], study_name=name).created is False


def test_stored_spec_and_report_copy_carry_no_credentials(tmp_path, monkeypatch):
    from primus_optuna.record.report import build_report

    monkeypatch.setenv("PRIMUS_TEST_TOKEN", "env-sentinel-987654")
    data = small_moe_study()
    data["storage"] = "postgresql+psycopg2://optuna:Hunter2pass@db.example.org/primus"
    data["llm"] = {"model": "openai/x", "api_base": "https://user:apipass99@llm.example.org/v1"}
    data["runner"] = {
        "kind": "command",
        "options": {
            "argv": ["train", "--note", "env-sentinel-987654"],
            "env": {"WANDB_API_KEY": "literal-42-secret"},
        },
    }
    spec = StudySpec.from_dict(data)
    url = f"sqlite:///{tmp_path / 'p.db'}"
    open_study(spec, storage=url)
    out = build_report(url, None, tmp_path / "rep")
    for blob in ((tmp_path / "p.db").read_bytes(), out["study"].read_bytes()):
        for secret in (b"Hunter2pass", b"apipass99", b"literal-42-secret", b"env-sentinel-987654"):
            assert secret not in blob
    public = spec.to_public_dict()
    assert public["storage"] == "postgresql+psycopg2://optuna:***@db.example.org/primus"
    assert public["runner"]["options"]["env"] == {"WANDB_API_KEY": "[redacted]"}
    assert StudySpec.from_dict(public).model == spec.model  # still a valid study file


def test_public_spec_masks_urls_in_every_option_and_survives_numeric_env(tmp_path, monkeypatch):
    monkeypatch.setenv("MAX_TOKENS_PER_SAMPLE", "128256")  # not a secret name; and numbers are never redacted
    monkeypatch.setenv("HF_TOKEN", "128256")  # a numeric value equal to Llama's vocab size
    data = small_moe_study()
    data["model"] = {"catalog": "llama3.1-8b"}
    data["runner"] = {
        "kind": "command",
        "options": {
            "argv": ["train", "--tracking", "https://ml:mlpw9876@mlflow.example.org"],
            "env": {"DB_URL": "postgresql://u:pa/ss1234@db/x", "TOKENIZERS_PARALLELISM": "false"},
        },
    }
    public = StudySpec.from_dict(data).to_public_dict()
    text = repr(public)
    assert "mlpw9876" not in text and "pa/ss1234" not in text
    assert public["runner"]["options"]["env"]["TOKENIZERS_PARALLELISM"] == "false"
    assert public["model"]["vocab_size"] == 128256


def test_resuming_after_the_network_file_changed_is_refused_and_says_so_briefly(tmp_path):
    """``cluster.network``'s measured points enter the space hash: a study resumed with another file's content
    is refused, the difference named by its length, not hundreds of rows."""
    url = f"sqlite:///{tmp_path / 'n.db'}"
    rows = "".join(f"all_reduce,8,4,{2**k},{k}.0\n" for k in range(10, 30))
    (tmp_path / "net.csv").write_text("collective,ranks,ranks_per_node,bytes,busbw_gbs\n" + rows)
    data = small_moe_study()
    data["cluster"]["network"] = "net.csv"
    open_study(StudySpec.from_dict(data, base_dir=tmp_path), storage=url)
    (tmp_path / "net.csv").write_text(
        "collective,ranks,ranks_per_node,bytes,busbw_gbs\n" + rows.replace(",12.0", ",9.0")
    )
    with pytest.raises(SpecError, match="changes the space") as err:
        open_study(StudySpec.from_dict(data, base_dir=tmp_path), storage=url)
    assert "cluster.network.rows: [20 items] -> [20 items]" in str(err.value)
    assert len(str(err.value)) < 2000
