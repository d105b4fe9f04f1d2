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
