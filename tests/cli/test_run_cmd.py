import os
import signal
import subprocess
import sys
import time

import optuna
import pytest
from click.testing import CliRunner

from primus_optuna.cli import cli
from tests.conftest import ROOT, small_moe_study

State = optuna.trial.TrialState


def _write(tmp_path, data):
    import yaml

    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return path


def invoke(*args):
    return CliRunner().invoke(cli, [str(a) for a in args])


def test_run_creates_resumes_and_summarises(tmp_path):
    study = _write(tmp_path, small_moe_study())
    url = f"sqlite:///{tmp_path / 'r.db'}"
    r = invoke("run", study, "--storage", url, "--n-trials", 12, "--no-progress")
    assert r.exit_code == 0, r.output
    out = r.output
    assert "study 'small-moe' created" in out and "12 trials" in out
    assert "best configuration (trial" in out and "tokens/s/GPU" in out
    assert "gain over the baseline" in out
    assert "trials by phase: fallback 8, sweep 4" in out  # the sweep's default share: 4 of n_trials=30
    assert "budget: 0 launched, 12 estimated by the analytical runner" in out
    assert "GPU-hours: none spent (no job launched)" in out
    assert f"primus-optuna report --storage {url} --study-name small-moe" in out
    assert f"primus-optuna dashboard --storage {url}" in out
    r2 = invoke("run", study, "--storage", url, "--n-trials", 6, "--seed", 3, "--no-progress")
    assert r2.exit_code == 0, r2.output
    assert "resumed (12 trials so far)" in r2.output
    loaded = optuna.load_study(study_name="small-moe", storage=url)
    assert len(loaded.trials) == 18
    keys = [t.user_attrs["config_key"] for t in loaded.trials if t.state == State.COMPLETE]
    assert len(keys) == len(set(keys))
    if any(t.state == State.PRUNED for t in loaded.trials):
        assert "pruned by reason: " in r2.output
    assert (tmp_path / "r-artifacts").is_dir()


def test_edited_space_is_refused_with_exit_code_2(tmp_path):
    url = f"sqlite:///{tmp_path / 'r.db'}"
    assert (
        invoke(
            "run", _write(tmp_path, small_moe_study()), "--storage", url, "--n-trials", 1, "--no-progress"
        ).exit_code
        == 0
    )
    edited = _write(tmp_path, small_moe_study(axes={"mbs": [1, 2]}))
    r = invoke("run", edited, "--storage", url, "--n-trials", 1, "--no-progress")
    assert r.exit_code == 2 and "changes the space" in r.output
    assert "; changed: search.axes.mbs: None -> [1, 2]" in r.output


def test_unknown_runner_is_a_user_error(tmp_path):
    r = invoke(
        "run",
        _write(tmp_path, small_moe_study()),
        "--runner",
        "nope",
        "--storage",
        f"sqlite:///{tmp_path / 'x.db'}",
    )
    assert r.exit_code == 2 and "unknown runner kind" in r.output


def test_run_without_llm_never_imports_dspy(tmp_path):
    study = _write(tmp_path, {**small_moe_study(), "llm": {"model": "openai/never-used"}})
    code = (
        "import sys\n"
        "from primus_optuna.cli import main\n"
        "try:\n"
        f"    main(['run', {str(study)!r}, '--storage', 'sqlite:///{tmp_path / 'n.db'}', '--n-trials', '3', "
        "'--no-llm', '--no-progress'])\n"
        "except SystemExit as e:\n"
        "    assert not e.code, e.code\n"
        "assert 'dspy' not in sys.modules and 'litellm' not in sys.modules, 'imported an LLM client'\n"
    )
    proc = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert "best configuration" in proc.stdout


def test_run_with_the_llm_planner_over_http(tmp_path, monkeypatch):
    import json

    from primus_optuna import Space, StudySpec
    from primus_optuna.physics.memory import estimate_memory
    from tests.helpers.openai_server import OpenAIServer

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-secret")
    data = small_moe_study(sweep_order=["mbs"])
    spec = StudySpec.from_dict(data)
    space = Space(spec)
    from primus_optuna.physics.throughput import estimate_throughput

    # the model's best idea: a candidate far below the best would not be launched
    pick = max(
        (c for c in space.configs() if estimate_memory(spec, c).fits),
        key=lambda c: estimate_throughput(spec, c).tokens_per_s_per_gpu,
    )
    reply = (
        "[[ ## reasoning ## ]]\ntry it\n\n[[ ## candidates ## ]]\n"
        + json.dumps([{**pick.to_params(), "rationale": "from the test"}])
        + "\n\n[[ ## completed ## ]]"
    )
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with OpenAIServer([reply]) as srv:
        r = invoke(
            "run",
            _write(tmp_path, data),
            "--storage",
            url,
            "--n-trials",
            6,
            "--no-progress",
            "--llm",
            "openai/test-model",
            "--llm-api-base",
            srv.url,
            "--llm-mode",
            "oneshot",
        )
    assert r.exit_code == 0, r.output
    assert "and planner openai/test-model (oneshot)" in r.output
    assert (
        "LLM planner openai/test-model: 2 calls (0 with no answer, 0 unparseable), 300 tokens, $0.0000, "
        "1 candidates rejected" in r.output
    )
    loaded = optuna.load_study(study_name="small-moe", storage=url)
    planned = [t for t in loaded.trials if t.user_attrs.get("phase") == "planner"]
    assert [t.user_attrs["config_key"] for t in planned] == [pick.key()]
    # the second round repeats the same answer: rejected as a duplicate, so the last trial is the fallback's
    assert loaded.trials[-1].user_attrs["phase"] == "fallback"
    assert not (tmp_path / "l-dspy-cache").exists()  # no cache with an API base unless llm.cache: true


def test_missing_llm_key_is_one_error_before_anything_is_created(tmp_path, monkeypatch):
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    db = tmp_path / "k.db"
    r = invoke(
        "run", _write(tmp_path, small_moe_study()), "--storage", f"sqlite:///{db}", "--llm", "openai/gpt-4o"
    )
    assert r.exit_code == 2
    assert r.output.startswith(
        "error: the LLM planner 'openai/gpt-4o' needs OPENAI_API_KEY in the environment"
    )
    assert len(r.output.strip().splitlines()) == 1 and not db.exists()


def test_run_json_summary_and_timeout(tmp_path):
    import json

    study = _write(tmp_path, small_moe_study())
    url = f"sqlite:///{tmp_path / 'j.db'}"
    r = CliRunner().invoke(cli, ["run", str(study), "--storage", url, "--n-trials", "4", "--json"])
    assert r.exit_code == 0, r.output
    doc = json.loads(r.stdout)  # stdout is the JSON alone; the progress lines went to stderr
    assert doc["study"] == "small-moe" and doc["trials"] == 4
    assert doc["best"]["trial"] >= 0 and doc["best"]["tokens_per_s_per_gpu"] > 0
    assert doc["baseline"]["trial"] == 0 and doc["trials_by_phase"] == {"sweep": 4}
    # --timeout: no new trial starts after the limit (here: one trial at most, the limit is tiny)
    r = invoke("run", study, "--storage", url, "--n-trials", 50, "--timeout", 0.001, "--no-progress")
    assert r.exit_code == 0, r.output
    assert len(optuna.load_study(study_name="small-moe", storage=url).trials) < 4 + 50


def _early_stop_study(tmp_path):
    from tests.helpers.runners import FAKE

    slow = ",".join(["1000.0"] * 2 + ["500.0"] * 40)
    data = small_moe_study()
    data["runner"] = {
        "kind": "command",
        "options": {
            "argv": [
                sys.executable,
                FAKE,
                "steps",
                "0.03",
                str(tmp_path / "pid"),
                f"{'1000.0,' * 7}1000.0;{slow}",
            ],
            "timeout_s": 60,
        },
    }
    return _write(tmp_path, data)


def test_launching_run_stops_slow_jobs_by_default_and_not_with_no_early_stop(tmp_path):
    study = _early_stop_study(tmp_path)
    url = f"sqlite:///{tmp_path / 'es.db'}"
    r = invoke("run", study, "--storage", url, "--n-trials", 2, "--no-progress", "--no-llm")
    assert r.exit_code == 0, r.output
    trials = optuna.load_study(study_name="small-moe", storage=url).trials
    assert [t.state for t in trials] == [State.COMPLETE, State.PRUNED]
    assert trials[1].user_attrs["prune_reason"].startswith("slow: 500.0")
    assert "pruned by reason: slow 1" in r.output
    hours = [t.user_attrs["gpu_hours"] for t in trials]
    saved = trials[1].user_attrs["gpu_hours_saved_early_stop"]
    assert saved > 0 and f"GPU-hours: {sum(hours):.2f} spent on 2 launched jobs" in r.output
    assert f"{saved:.2f} thanks to early stopping (1 job stopped early)" in r.output
    url2 = f"sqlite:///{tmp_path / 'full.db'}"
    r = invoke(
        "run", study, "--storage", url2, "--n-trials", 2, "--no-progress", "--no-llm", "--no-early-stop"
    )
    assert r.exit_code == 0, r.output
    trials = optuna.load_study(study_name="small-moe", storage=url2).trials
    assert [t.state for t in trials] == [State.COMPLETE, State.COMPLETE]
    assert len(trials[1].intermediate_values) == 40  # still reported, for the dashboard
    assert "0.00 thanks to early stopping (0 jobs stopped early)" in r.output


def test_warm_start_flag_imports_and_refuses_another_model_writing_nothing(tmp_path):
    from tests.conftest import small_dense_study

    old = f"sqlite:///{tmp_path / 'old.db'}"
    r = invoke("run", _write(tmp_path, small_moe_study()), "--storage", old, "--n-trials", 2, "--no-progress")
    assert r.exit_code == 0, r.output
    new = tmp_path / "new.db"
    dense = _write(tmp_path, small_dense_study())
    r = invoke(
        "run", dense, "--storage", f"sqlite:///{new}", "--warm-start", f"{old}:small-moe", "--no-progress"
    )
    assert r.exit_code == 2 and "tuned model 'mixtral-8x7b'" in r.output and "--force-warm-start" in r.output
    assert not new.exists()
    r = invoke(
        "run", _write(tmp_path, small_moe_study()), "--storage", f"sqlite:///{new}", "--n-trials", 1,
        "--warm-start", old, "--no-progress",
    )  # fmt: skip
    assert r.exit_code == 0, r.output
    assert (
        f"warm start from {old}: 0 measured trials imported" in r.output
    )  # analytical trials are not measured


def test_run_warns_when_the_baseline_does_not_fit_and_names_the_gain_over_the_sweep_centre(tmp_path):
    data = {
        "name": "unfit",
        "model": {"catalog": "llama3.1-8b"},
        "cluster": {"gpu": "h100", "nodes": 1, "gpus_per_node": 8},
        "workload": {"seq_length": 4096, "global_batch_size": 64, "precision": "bf16"},
        "search": {
            "n_trials": 3,
            "baseline": {"tp": 1, "pp": 1, "mbs": 1, "recompute": "none"},
            "axes": {"tp": [1, 2, 4], "pp": [1], "mbs": [1, 2], "recompute": ["none"], "cp": [1], "vpp": [1]},
        },
    }
    r = invoke("run", _write(tmp_path, data), "--storage", f"sqlite:///{tmp_path / 'u.db'}", "--no-progress")
    assert r.exit_code == 0, r.output
    warning = next(line for line in r.output.splitlines() if line.startswith("warning: "))
    assert "does not fit in memory" in warning and "GiB usable" in warning and "tp 1→2" in warning
    gain = next(line for line in r.output.splitlines() if "gain over" in line).strip()
    assert gain.startswith("gain over the sweep centre (trial 0, ")
    assert "estimated; the study's baseline was not run: it does not fit in memory; centred on" in gain
    assert gain.count("the study's baseline") == 1
    from primus_optuna.record.report import build_report

    md = build_report(f"sqlite:///{tmp_path / 'u.db'}", "unfit", tmp_path / "rep")["md"].read_text()
    assert f"**Gain**{gain.removeprefix('gain')}." in md  # the same sentence as the run summary
    assert "0 launched, 3 estimated by the analytical runner (no GPU)" in md


def test_llm_flags_override_the_study_file(tmp_path, monkeypatch):
    """--llm, --llm-api-base, --llm-mode, --llm-max-calls and --llm-timeout reach the planner."""
    from primus_optuna.search import sampler as sampler_module
    from primus_optuna.search.llm_budget import llm_accounting
    from primus_optuna.spec import StudySpec
    from tests.helpers.openai_server import OpenAIServer

    monkeypatch.setenv("OPENAI_API_KEY", "sk-test-not-a-secret")
    data = small_moe_study(sweep_order=["mbs"])
    study = _write(tmp_path, data)
    seen = {}
    init = sampler_module.PrimusSampler.__init__

    def spy(self, spec, *args, **kwargs):
        seen["llm"] = kwargs.get("llm")
        init(self, spec, *args, **kwargs)

    monkeypatch.setattr(sampler_module.PrimusSampler, "__init__", spy)
    n = len(sampler_module.PrimusSampler(StudySpec.from_dict(data)).plan) + 3
    url = f"sqlite:///{tmp_path / 'l.db'}"
    with OpenAIServer(["no parseable answer"]) as srv:
        r = invoke(
            "run", study, "--storage", url, "--n-trials", n, "--no-progress", "--llm", "openai/test-model",
            "--llm-api-base", srv.url, "--llm-mode", "oneshot", "--llm-max-calls", 2, "--llm-timeout", 3.5,
        )  # fmt: skip
    assert r.exit_code == 0, r.output
    llm = seen["llm"]
    assert (llm.model, llm.mode, llm.max_calls, llm.timeout_s) == ("openai/test-model", "oneshot", 2, 3.5)
    books = llm_accounting(optuna.load_study(study_name="small-moe", storage=url))
    assert books["calls"] == 2 and books["mode"] == "oneshot"


def test_duration_flags_refuse_a_non_positive_value(tmp_path):
    study = _write(tmp_path, small_moe_study())
    for flag in ("--llm-timeout", "--timeout"):
        r = invoke("run", study, "--storage", f"sqlite:///{tmp_path / 'd.db'}", flag, 0)
        assert r.exit_code == 2 and flag in r.output and "x>0" in r.output, r.output
        assert not (tmp_path / "d.db").exists()


CLI_PROCESS = [sys.executable, "-c", "from primus_optuna.cli import main; main()"]


def _cli_process(args: list[str], cwd: os.PathLike[str]) -> subprocess.Popen[str]:
    """The real command in a subprocess (stdout and stderr piped, as text), this checkout first on the path."""
    path = os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")]))
    pipe = subprocess.PIPE
    env = {**os.environ, "PYTHONPATH": path}
    return subprocess.Popen([*CLI_PROCESS, *args], cwd=cwd, env=env, stdout=pipe, stderr=pipe, text=True)


"""``primus-optuna`` as a process (the console script's body, without needing it installed)"""


def _trials_of(url: str, name: str) -> list:
    try:
        return optuna.load_study(study_name=name, storage=url).get_trials(deepcopy=False)
    except KeyError:  # not created yet
        return []


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM], ids=["ctrl-c", "sigterm"])
def test_a_signal_to_run_exits_128_plus_it_and_names_it(tmp_path, sig):
    # the real command in a subprocess, on the analytical runner: the stop flag decides the line and the code
    study = _write(tmp_path, small_moe_study())
    url = f"sqlite:///{tmp_path / 's.db'}"
    args = ["run", str(study), "--storage", url, "--n-trials", "200", "--no-llm", "--no-progress"]
    proc = _cli_process(args, tmp_path)
    try:
        t0 = time.monotonic()
        while len(_trials_of(url, "small-moe")) < 2 and proc.poll() is None and time.monotonic() - t0 < 60:
            time.sleep(0.05)
        proc.send_signal(sig)
        out, err = proc.communicate(timeout=60)
    finally:
        proc.kill()
    name = signal.Signals(sig).name
    assert proc.returncode == 128 + sig, err[-3000:]
    assert f"interrupted ({name})" in err and "run the same command again" in err, err[-3000:]
    assert "Traceback" not in err + out and "best configuration (trial" in out
    ts = _trials_of(url, "small-moe")
    assert 2 <= len(ts) < 200 and not [t.number for t in ts if t.state == State.RUNNING]
    failed = [t for t in ts if t.state == State.FAIL]
    assert all(t.user_attrs["failure_reason"] == "interrupted" for t in failed)
    assert all(t.user_attrs["interrupted_by"] == name for t in failed if "interrupted_by" in t.user_attrs)


def test_a_signal_while_the_summary_is_written_still_exits_143(tmp_path, monkeypatch):
    # the graceful handler raises nothing at a first signal: only the stop flag tells that one came
    from primus_optuna.cli import run_cmd

    summary = run_cmd._print_summary

    def signalled_summary(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGTERM)
        summary(*args, **kwargs)

    monkeypatch.setattr(run_cmd, "_print_summary", signalled_summary)
    study = _write(tmp_path, small_moe_study())
    url = f"sqlite:///{tmp_path / 's.db'}"
    r = invoke("run", study, "--storage", url, "--n-trials", 3, "--no-progress")
    assert r.exit_code == 143, r.output
    assert "best configuration (trial" in r.output and "interrupted (SIGTERM)" in r.output
    assert [t.state for t in _trials_of(url, "small-moe")] == [State.COMPLETE] * 3


def test_a_signal_while_the_study_is_opened_starts_no_trial(tmp_path, monkeypatch):
    from primus_optuna.run import objective

    requeue = objective.requeue_interrupted

    def signalled_requeue(study):  # run calls it once the study is open, before the first trial
        os.kill(os.getpid(), signal.SIGTERM)
        return requeue(study)

    monkeypatch.setattr(objective, "requeue_interrupted", signalled_requeue)
    study = _write(tmp_path, small_moe_study())
    url = f"sqlite:///{tmp_path / 's.db'}"
    r = invoke("run", study, "--storage", url, "--n-trials", 3, "--no-progress")
    assert r.exit_code == 143, r.output
    assert "interrupted (SIGTERM); run the same command again" in r.output
    assert _trials_of(url, "small-moe") == []


def test_progress_line_names_the_fastest_trial_of_a_pareto_front(capsys):
    from primus_optuna.cli.run_cmd import ProgressLines

    study = optuna.create_study(directions=["maximize", "minimize"])
    dist = {"x": optuna.distributions.FloatDistribution(0, 1)}
    # a front of three; Optuna's best_trials lists them by number, not by throughput
    for values in ([100.0, 10.0], [300.0, 30.0], [200.0, 20.0]):
        study.add_trial(optuna.trial.create_trial(params={"x": 0.5}, distributions=dist, values=values))
    progress = ProgressLines(n_trials=3)
    progress(study, study.trials[-1])
    assert "best 300.0 (trial 1)" in capsys.readouterr().err


def test_a_launch_that_fails_the_same_way_stops_the_run_and_a_missing_checkout_writes_nothing(tmp_path):
    data = small_moe_study()
    data["runner"] = {
        "kind": "command",
        "options": {"argv": [sys.executable, "-c", "import sys; sys.exit('train.sh: no such file')"]},
    }
    url = f"sqlite:///{tmp_path / 'f.db'}"
    r = invoke("run", _write(tmp_path, data), "--storage", url, "--n-trials", 10, "--no-progress", "--no-llm")
    assert r.exit_code == 1, r.output
    trials = optuna.load_study(study_name="small-moe", storage=url).trials
    assert [t.state for t in trials] == [State.FAIL] * 3  # not 10
    assert "trials #0, #1, #2 failed to launch the same way (train.sh: no such file)" in r.output
    # the megatron preset's checkout is checked before anything is created
    megatron = {"megatron_path": str(tmp_path / "Megatron-LM"), "hosts": ["n0", "n1"]}
    data["runner"] = {"kind": "megatron", "options": megatron}
    url = f"sqlite:///{tmp_path / 'm.db'}"
    r = invoke("run", _write(tmp_path, data), "--storage", url, "--n-trials", 2, "--no-progress", "--no-llm")
    assert (
        r.exit_code == 2
        and "runner.options.megatron_path" in r.output
        and "has no pretrain_gpt.py" in r.output
    )
    assert not (tmp_path / "m.db").exists()


def test_an_unknown_llm_provider_is_one_error_and_nothing_on_stdout(tmp_path):
    study = _write(tmp_path, small_moe_study())
    env = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"}
    args = [
        "run",
        str(study),
        "--storage",
        f"sqlite:///{tmp_path / 'l.db'}",
        "--llm",
        "foo/bar",
        "--no-progress",
    ]
    r = subprocess.run([*CLI_PROCESS, *args], capture_output=True, text=True, env=env, timeout=120)
    assert r.returncode == 2, r.stderr
    assert "LiteLLM does not know its provider" in r.stderr
    assert r.stdout.strip() == ""  # LiteLLM's coloured "Provider List" banner went here before
    assert not (tmp_path / "l.db").exists()


def test_a_sweep_begun_at_the_models_best_is_said_once_and_the_gain_names_the_baseline_estimate(tmp_path):
    """``search.start: auto`` on one node whose baseline the model puts far below its best (beyond the ±18% ratio
    band): a note (not a warning) says where the sweep begins and why; the summary's gain line says the
    baseline was not run and gives the model's figure for it; the report's sweep section carries the note."""
    from tests.conftest import small_dense_study

    data = small_dense_study(n_trials=4)
    data["search"]["baseline"] = {"tp": 4, "pp": 2, "mbs": 1, "recompute": "full"}
    study = _write(tmp_path, data)
    db = tmp_path / "s.db"
    r = invoke("run", study, "--storage", f"sqlite:///{db}", "--no-progress")
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    (begin,) = [x for x in lines if "the sweep begins at" in x]
    assert (
        begin.startswith("the sweep begins at ") and "search.start: baseline begins at the baseline" in begin
    )
    assert not [x for x in lines if x.startswith("warning:") and "model's best" in x]
    gain = next(x for x in lines if "gain over the sweep centre, the model's best" in x)
    assert "the baseline was not run" in gain and "over the baseline's" in gain
    r = invoke(
        "report", "--storage", f"sqlite:///{db}", "--study-name", data["name"], "--out", tmp_path / "rep"
    )
    assert r.exit_code == 0, r.output
    md = (tmp_path / "rep" / "report.md").read_text()
    assert "the model's best, estimated" in md


def test_warnings_during_a_run_read_as_the_commands_own_lines(tmp_path):
    """A planner warning in a run is "warning: ...", like the command's other lines, not Optuna's "[W <date>]"."""
    from tests.helpers.openai_server import OpenAIServer, Reply

    study = _write(tmp_path, small_moe_study())
    url = f"sqlite:///{tmp_path / 'w.db'}"
    with OpenAIServer([Reply(status=500)]) as srv:
        args = ["run", str(study), "--storage", url, "--n-trials", "6", "--no-progress"]
        proc = _cli_process([*args, "--llm", "openai/test-model", "--llm-api-base", srv.url], tmp_path)
        _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    failed = [line for line in err.splitlines() if "planner call failed" in line]
    assert failed and all(line.startswith("warning: planner call failed, falling back") for line in failed)
    assert "[W " not in err
