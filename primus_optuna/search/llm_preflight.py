"""The planner's pre-flight, run before a study is created: does the model string resolve, does the server answer?

- the provider of ``llm.model`` must resolve through LiteLLM's own lookup (``litellm.get_llm_provider``);
- with an API base, ``GET {api_base}/models`` must answer (Ollama's native base: ``GET /api/tags``); the
  served models are named, and the context size where the server gives it (vLLM ``max_model_len``,
  llama.cpp ``meta.n_ctx_train``, LM Studio / others ``context_length``) must hold
  ``llm.max_prompt_tokens + llm.max_tokens`` (a warning when it does not hold them with :data:`TOKEN_MARGIN`). An API base that answers 404 and does not end in ``/v1`` is
  told to add it.

Every failure is one :class:`~primus_optuna.errors.SpecError` naming the fix (the CLI exits 2 with one
``error:`` line and creates nothing). No key is sent anywhere but the ``Authorization`` header.
"""

from __future__ import annotations

import json
import os
import urllib.error
import urllib.request
from typing import Any

from ..errors import SpecError
from ..redaction import redact
from ..spec.study import LLMSpec
from .llm_client import KEY_WANTED, api_key

TIMEOUT_S = 5.0
TOKEN_MARGIN = 1.17
"""how far a prompt's real token count may exceed the planner's estimate
(``planner_prompt.CHARS_PER_TOKEN``): a small vocabulary counts more tokens: SmolLM2's prompts ran up to 16%
over it (rank mode, llama-server's ``prompt_tokens``, 2026-12-07); the context a server needs is sized with it"""


def context_needed(prompt_tokens: int, max_tokens: int) -> int:
    """The server context that holds a prompt estimated at ``prompt_tokens`` (:data:`TOKEN_MARGIN` over) and
    an answer of ``max_tokens``."""
    return int(prompt_tokens * TOKEN_MARGIN + 0.999) + max_tokens


CONTEXT_KEYS = (
    "max_model_len",
    "context_length",
    "context_window",
    "n_ctx",
    "n_ctx_train",
    "max_context_length",
)


def resolve_provider(model: str, api_base: str | None = None) -> str:
    """LiteLLM's provider for ``model`` (raises :class:`SpecError` naming the fix when it has none)."""
    os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
    import litellm

    litellm.suppress_debug_info = True
    try:
        _, provider, _, _ = litellm.get_llm_provider(model=model, api_base=api_base)
    except Exception:
        raise SpecError(
            f"llm.model {model!r}: LiteLLM does not know its provider; write provider/name, e.g. "
            "openai/<served model name> with --llm-api-base for vLLM, llama.cpp or any OpenAI-compatible "
            "server, ollama/llama3.2, anthropic/claude-sonnet-4-5 or openai/gpt-4o"
        ) from None
    return str(provider)


def _context(entry: dict[str, Any]) -> int | None:
    for source in (entry, entry.get("meta") or {}, entry.get("details") or {}):
        for k in CONTEXT_KEYS:
            v = source.get(k) if isinstance(source, dict) else None
            if isinstance(v, int) and v > 0:
                return v
    return None


def _get(url: str, api_key: str | None) -> Any:
    req = urllib.request.Request(url, headers={"Authorization": f"Bearer {api_key}"} if api_key else {})
    with urllib.request.urlopen(req, timeout=TIMEOUT_S) as resp:  # noqa: S310 (the user's own server)
        return json.loads(resp.read() or b"{}")


def served_models(api_base: str, provider: str, api_key: str | None = None) -> list[tuple[str, int | None]]:
    """``(name, context tokens or None)`` of every model the server at ``api_base`` lists."""
    base = api_base.rstrip("/")
    ollama_native = provider in ("ollama", "ollama_chat") and not base.endswith("/v1")
    url = base + ("/api/tags" if ollama_native else "/models")
    try:
        data = _get(url, api_key)
    except urllib.error.HTTPError as exc:
        hint = ""
        if exc.code == 404 and not base.endswith("/v1"):
            hint = (
                f"; the API base of an OpenAI-compatible server usually ends in /v1: --llm-api-base {base}/v1"
            )
        elif exc.code in (401, 403):
            hint = f"; {KEY_WANTED}"
        raise SpecError(
            f"--llm-api-base {redact(base)}: GET {redact(url)} answered HTTP {exc.code}{hint}"
        ) from None
    except (urllib.error.URLError, OSError, ValueError) as exc:
        reason = getattr(exc, "reason", exc)
        raise SpecError(
            f"--llm-api-base {redact(base)}: GET {redact(url)} failed ({reason}); is the server running and "
            "is the URL right (scheme, host, port, /v1)? Or run with --no-llm"
        ) from None
    entries = data.get("models" if ollama_native else "data") if isinstance(data, dict) else None
    if not isinstance(entries, list):
        raise SpecError(
            f"--llm-api-base {redact(base)}: GET {redact(url)} did not answer a model list; is this an "
            "OpenAI-compatible server (its base usually ends in /v1)?"
        )
    out = []
    for e in entries:
        if isinstance(e, dict):
            name = e.get("id") or e.get("name") or e.get("model")
            if name:
                out.append((str(name), _context(e)))
    return out


def preflight(settings: LLMSpec, api_base: str | None = None) -> list[str]:
    """Check the planner's key, model and server before the study is created; the lines to show (what was
    found, and warnings). Raises :class:`SpecError` naming the fix."""
    key = api_key(settings, api_base)
    model = settings.model or ""
    provider = resolve_provider(model, api_base)
    if not api_base:
        return [f"planner {model} (provider {provider})"]
    if key is None and provider == "openai":
        key = os.environ.get("OPENAI_API_KEY")
    served = served_models(api_base, provider, key)
    name = model.split("/", 1)[1] if "/" in model else model
    lines = []
    match = next((m for m in served if m[0] == name or m[0].rsplit("/", 1)[-1] == name), None)
    if match is None:
        names = ", ".join(m[0] for m in served[:8]) or "none"
        lines.append(
            f"warning: {redact(api_base)} lists {names}, not {name!r} (vLLM answers 404 for a name it does "
            f"not serve: use --llm {provider}/<listed name>)"
        )
        ctx = served[0][1] if len(served) == 1 else None
    else:
        ctx = match[1]
    budget = settings.prompt_budget(local=True, agent=settings.mode == "agent")
    need = budget + settings.max_tokens
    if ctx is not None and ctx < need:
        raise SpecError(
            f"the server's context for {name!r} is {ctx} tokens, less than llm.max_prompt_tokens + "
            f"llm.max_tokens = {need}: start the server with a larger context (llama.cpp -c, vLLM "
            f"--max-model-len) or lower llm.max_prompt_tokens / llm.max_tokens"
        )
    if ctx is not None and ctx < (safe := context_needed(budget, settings.max_tokens)):
        lines.append(
            f"warning: the context of {ctx} tokens holds llm.max_prompt_tokens ({budget}, estimated) + "
            f"llm.max_tokens only if the model's tokenizer counts as the estimate; a small vocabulary counts up "
            f"to {TOKEN_MARGIN - 1:.0%} more (SmolLM2): start the server with -c {safe} or more, or lower "
            f"llm.max_prompt_tokens to {int((ctx - settings.max_tokens) / TOKEN_MARGIN)}"
        )
    lines.insert(
        0,
        f"planner {model} at {redact(api_base)}: "
        + (f"model {match[0]!r} served" if match else f"{len(served)} model(s) served")
        + (f", context {ctx} tokens" if ctx else ", context size not given"),
    )
    return lines
