"""The planner's connection: what a failed call means."""

import pytest


@pytest.mark.parametrize(
    "message",
    [
        "the request exceeds the available context size, try increasing it",  # llama.cpp, before generating
        "Context size has been exceeded.",  # llama.cpp, while generating
        "This model's maximum context length is 4096 tokens. However, you requested 5120 tokens",  # vLLM
        "the input length exceeds the context length",  # Ollama
        "prompt too long; exceeded max context length by 12 tokens",  # Ollama
    ],
)
def test_context_errors_of_local_servers_stop_the_planner(message):
    import litellm

    from primus_optuna.search.llm_client import classify_error

    exc = litellm.BadRequestError(message, model="m", llm_provider="openai")
    kind, why = classify_error(exc)
    assert kind == "fatal" and "context" in why


def test_the_key_sent_is_the_named_variable_the_placeholder_or_the_providers_own(monkeypatch):
    from primus_optuna.errors import SpecError
    from primus_optuna.search.llm_client import NO_KEY, api_key
    from primus_optuna.spec.study import LLMSpec

    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    local, remote = "http://localhost:8000/v1", "https://llm.example.com/v1"
    assert api_key(LLMSpec(model="openai/m"), local) == NO_KEY
    with pytest.raises(SpecError, match=r"needs OPENAI_API_KEY in the environment: export OPENAI_API_KEY="):
        api_key(LLMSpec(model="openai/m"), remote)
    named = LLMSpec(model="openai/m", api_key_env="SERVER_KEY")
    with pytest.raises(SpecError, match=r"llm.api_key_env names 'SERVER_KEY' but .* export SERVER_KEY="):
        api_key(named, local)
    monkeypatch.setenv("SERVER_KEY", "k-123")
    assert api_key(named, local) == api_key(named, remote) == "k-123"
    monkeypatch.setenv("OPENAI_API_KEY", "k-456")
    assert api_key(LLMSpec(model="openai/m"), remote) is None  # LiteLLM reads OPENAI_API_KEY itself
    assert api_key(LLMSpec(model="openai/m"), local) is None
