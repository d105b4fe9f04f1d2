"""The planner's pre-flight: provider lookup, ``GET {api_base}/models``, context size, the ``/v1`` hint; and the
CLI refusing a bad endpoint with exit code 2, one ``error:`` line and no study written."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml
from click.testing import CliRunner

from primus_optuna.cli import cli
from primus_optuna.errors import SpecError
from primus_optuna.record.report import build_report
from primus_optuna.search.llm_preflight import preflight, resolve_provider
from primus_optuna.search.sampler import PrimusSampler
from primus_optuna.spec import StudySpec
from primus_optuna.spec.study import LLMSpec
from tests.conftest import small_moe_study
from tests.helpers.openai_server import OpenAIServer

pytestmark = pytest.mark.usefixtures("openai_key")


def test_provider_strings_resolve_through_litellm():
    assert resolve_provider("openai/anything") == "openai"
    assert resolve_provider("ollama/llama3.2") == "ollama"
    with pytest.raises(SpecError, match=r"LiteLLM does not know its provider; write provider/name"):
        resolve_provider("nonsense-provider/model-x")


def test_models_endpoint_names_the_model_and_its_context():
    with OpenAIServer([], models=[("test-model", 8192), ("other", None)]) as srv:
        lines = preflight(LLMSpec(model="openai/test-model"), srv.url)
        assert lines == [
            f"planner openai/test-model at {srv.url}: model 'test-model' served, context 8192 tokens"
        ]
        warn = preflight(LLMSpec(model="openai/absent"), srv.url)
        assert warn[1].startswith("warning:") and "lists test-model, other, not 'absent'" in warn[1]


def test_missing_v1_is_named_as_the_likely_fix():
    with OpenAIServer([]) as srv:
        base = srv.url.removesuffix("/v1")
        with pytest.raises(
            SpecError, match=r"answered HTTP 404; .* usually ends in /v1: --llm-api-base .*/v1"
        ):
            preflight(LLMSpec(model="openai/test-model"), base)


def test_a_server_that_wants_a_key_is_named_as_such():
    with OpenAIServer([], api_key="the-servers-key") as srv:  # vLLM with --api-key guards its model list
        with pytest.raises(
            SpecError, match=r"answered HTTP 401; the server wants the key it was started with: export it"
        ):
            preflight(LLMSpec(model="openai/test-model"), srv.url)
        keyed = LLMSpec(model="openai/test-model", api_key_env="SERVER_KEY")
        with pytest.MonkeyPatch.context() as mp:
            mp.setenv("SERVER_KEY", "the-servers-key")
            assert "model 'test-model' served" in preflight(keyed, srv.url)[0]


def test_small_context_and_dead_server_are_refused():
    with OpenAIServer([], models=[("test-model", 2048)]) as srv:
        with pytest.raises(SpecError, match=r"context for 'test-model' is 2048 tokens, less than .* = 4000"):
            preflight(LLMSpec(model="openai/test-model"), srv.url)
        url = srv.url
    with pytest.raises(SpecError, match=r"failed .*is the server running"):
        preflight(LLMSpec(model="openai/test-model"), url)


def _study_file(tmp_path: Path, **llm) -> tuple[Path, dict]:
    data = small_moe_study(sweep_order=["mbs"])
    data["llm"] = {"num_retries": 0, "timeout_s": 5, "max_calls": 1, **llm}
    path = tmp_path / "study.yaml"
    path.write_text(yaml.safe_dump(data))
    return path, data


def test_cli_refuses_a_bad_api_base_before_creating_the_study(tmp_path):
    path, _ = _study_file(tmp_path)
    db = tmp_path / "x.db"
    with OpenAIServer([]) as srv:
        r = CliRunner().invoke(
            cli,
            ["run", str(path), "--storage", f"sqlite:///{db}", "--llm", "openai/test-model"]
            + ["--llm-api-base", srv.url.removesuffix("/v1"), "--no-progress"],
        )
    lines = [x for x in r.output.splitlines() if x.strip()]
    assert r.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), r.output
    assert "/v1" in lines[0] and not db.exists()


def test_model_given_on_the_command_line_is_named_in_summary_and_report(tmp_path):
    path, data = _study_file(tmp_path)
    spec = StudySpec.from_dict(data)
    n = len(PrimusSampler(spec).plan) + 2
    storage = f"sqlite:///{tmp_path / 'c.db'}"
    with OpenAIServer(["no parseable answer here"]) as srv:
        r = CliRunner().invoke(
            cli,
            ["run", str(path), "--storage", storage, "--n-trials", str(n), "--llm", "openai/test-model"]
            + ["--llm-api-base", srv.url, "--llm-mode", "oneshot", "--no-progress"],
        )
    assert r.exit_code == 0, r.output
    assert (
        f"planner openai/test-model at {srv.url}: model 'test-model' served, context 4096 tokens" in r.output
    )
    summary = next(x for x in r.output.splitlines() if x.startswith("LLM planner openai/test-model: "))
    assert "1 calls (0 with no answer, 1 unparseable), 150 tokens" in summary
    assert "; stopped: llm.max_calls=1 reached" in summary
    md = build_report(storage, None, tmp_path / "report")["md"].read_text()
    assert "**LLM**: openai/test-model (given on the command line), oneshot" in md
    assert "1 unparseable), 150 tokens" in md
    assert "no LLM configured" not in md
    assert "--llm openai/test-model" in md  # the reproduce command


def test_a_context_that_holds_the_budget_only_at_the_estimate_is_warned_about():
    """4096 tokens hold the default 3000 + 1000 as estimated, not with a small vocabulary's 17% more: a
    warning names the context to ask for (and the budget that would fit), the run is not refused."""
    from primus_optuna.search.llm_preflight import TOKEN_MARGIN, context_needed

    with OpenAIServer([], models=[("test-model", 4096)]) as srv:
        lines = preflight(LLMSpec(model="openai/test-model"), srv.url)
    safe = context_needed(3000, 1000)
    assert safe == int(3000 * TOKEN_MARGIN + 0.999) + 1000 > 4096
    (warn,) = [x for x in lines if x.startswith("warning: the context of 4096 tokens")]
    assert f"-c {safe} or more" in warn and f"llm.max_prompt_tokens to {int(3096 / TOKEN_MARGIN)}" in warn
    with OpenAIServer([], models=[("test-model", 8192)]) as srv:
        assert not [x for x in preflight(LLMSpec(model="openai/test-model"), srv.url) if "warning" in x]
