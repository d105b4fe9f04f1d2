"""The planner's connection to its LLM, through DSPy and LiteLLM, and what a failed call means.

- :func:`require_api_key`: the provider's key is checked before a study is created (one error naming the
  variable to set); a server on this machine needs none (:data:`NO_KEY`).
- :func:`classify_error`: a failed call as ``auth``, ``fatal`` (HTTP 404, a context window exceeded in the
  words of OpenAI, vLLM, llama.cpp or Ollama, an unknown provider), ``no_tools``, ``timeout``,
  ``unparseable`` or ``failed`` (a refused connection named as such: :func:`refused`).
- :class:`AnswerCache` (:func:`configure_cache`): DSPy's cache that takes an answer out again when it did not
  parse (:func:`stored_keys`, :func:`forget_since`).
- :class:`PlannerLM`: ``dspy.LM`` with a deadline for the whole planner call and native tool calls declared
  for an OpenAI-compatible server; :class:`PlannerAdapter`: DSPy's JSON adapter with the study's answer
  schema as ``response_format``.
- :func:`is_local`, :func:`supports_tools`, :func:`truncated`: where the server is, what it supports, whether
  an answer stopped at ``llm.max_tokens`` (DSPy's own warning for that is dropped).

This module imports DSPy; import it only when a planner is configured.
"""

from __future__ import annotations

import logging
import os
import re
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import dspy
from dspy.clients import DISK_CACHE_LIMIT
from dspy.clients.cache import Cache

from ..errors import SpecError
from ..spec.study import LLMSpec

_cache_lock = threading.Lock()
_configured_cache: str | None = None


NO_KEY = "no-key"
"""the key sent to a server on this machine when the environment holds none (llama.cpp, vLLM and Ollama ask
for none unless started with one; OpenAI's client sends no request without some key)"""

KEY_WANTED = (
    "the server wants the key it was started with: export it (OPENAI_API_KEY, or name its variable with "
    "llm.api_key_env)"
)
"""what to do when a server refuses the request for want of a key (its model list or a call)"""


def _missing_keys(settings: LLMSpec, api_base: str | None) -> list[str]:
    """The environment variables LiteLLM needs for ``settings.model`` and does not find (``[]`` when it does
    not know the provider: LiteLLM itself will say so at the first call)."""
    import litellm

    litellm.suppress_debug_info = True  # else an unknown provider prints a coloured banner to stdout
    try:
        return list(
            litellm.validate_environment(model=settings.model, api_base=api_base).get("missing_keys") or []
        )
    except Exception:
        return []


def require_api_key(settings: LLMSpec, api_base: str | None = None) -> str | None:
    """Raise one :class:`SpecError` naming the environment variable to set when the chosen provider's key is
    missing (LiteLLM's per-provider variables, or ``llm.api_key_env``); checked before a study is created.
    Returns the key to send in place of the environment's: :data:`NO_KEY` for a server on this machine
    (:func:`is_local`) when the environment holds none, else ``None``."""
    env = settings.api_key_env
    if env:
        if not os.environ.get(env):
            raise SpecError(
                f"llm.api_key_env names {env!r} but that environment variable is not set: export {env}=... "
                "(or run with --no-llm)"
            )
        return None
    missing = _missing_keys(settings, api_base)
    if missing and is_local(api_base):
        return NO_KEY
    if missing:
        names = " and ".join(missing)
        raise SpecError(
            f"the LLM planner {settings.model!r} needs {names} in the environment: export {missing[0]}=... "
            "(or name the variable holding the key with llm.api_key_env, or run with --no-llm)"
        )
    return None


def api_key(settings: LLMSpec, api_base: str | None = None) -> str | None:
    """The key to send with a request, after :func:`require_api_key`'s check: ``llm.api_key_env``'s value,
    :data:`NO_KEY` for a server on this machine when the environment holds none, else ``None`` (LiteLLM reads
    the provider's own variable)."""
    key = require_api_key(settings, api_base)
    return os.environ[settings.api_key_env] if settings.api_key_env else key


def is_auth_error(exc: BaseException) -> bool:
    """Whether ``exc`` (or what it wraps) is the provider refusing the credentials (HTTP 401/403)."""
    seen: set[int] = set()
    e: BaseException | None = exc
    while e is not None and id(e) not in seen:
        seen.add(id(e))
        if getattr(e, "status_code", None) in (401, 403) or "AuthenticationError" in type(e).__name__:
            return True
        if "PermissionDenied" in type(e).__name__:
            return True
        e = e.__cause__ or e.__context__
    return False


class AnswerCache(Cache):
    """DSPy's cache that remembers the keys it stored, so the answers of a call that did not parse are taken
    out again (else every rerun with the same prompt replays the bad answer and never asks the server)."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.stored: list[str] = []

    def put(
        self, request: dict[str, Any], value: Any, ignored_args_for_cache_key: Any = None, **kw: Any
    ) -> None:
        super().put(request, value, ignored_args_for_cache_key, **kw)
        try:
            key = self.cache_key(request, ignored_args_for_cache_key)
        except Exception:
            return
        with self._lock:
            self.stored.append(key)

    def forget(self, keys: Sequence[str]) -> None:
        """Take ``keys`` out of the memory and disk caches."""
        with self._lock:
            for key in keys:
                if self.enable_memory_cache:
                    self.memory_cache.pop(key, None)
                if self.enable_disk_cache:
                    try:
                        self.disk_cache.delete(key)
                    except Exception:  # the disk cache is best-effort
                        pass


def configure_cache(cache_dir: str | Path) -> None:
    """Put DSPy's disk cache in ``cache_dir`` (once per process and directory)."""
    global _configured_cache
    with _cache_lock:
        if _configured_cache == str(cache_dir):
            return
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        cache = AnswerCache(True, True, str(cache_dir), DISK_CACHE_LIMIT, 1_000_000)
        with dspy._cache_lock:  # as dspy.configure_cache does
            dspy.cache = cache
        _configured_cache = str(cache_dir)


def stored_keys() -> int:
    cache = dspy.cache
    return len(cache.stored) if isinstance(cache, AnswerCache) else 0


def forget_since(start: int) -> None:
    """Take out of the cache every answer stored since ``stored_keys()`` was ``start``."""
    cache = dspy.cache
    if isinstance(cache, AnswerCache):
        cache.forget(cache.stored[start:])


# --- errors ------------------------------------------------------------------------------------------------
def _chain(exc: BaseException, *, context: bool = True) -> list[BaseException]:
    """``exc`` and what it wraps: its causes, and (``context``) the exceptions it was raised while handling."""
    seen: list[BaseException] = []
    e: BaseException | None = exc
    while e is not None and all(e is not s for s in seen):
        seen.append(e)
        e = e.__cause__ or (e.__context__ if context else None)
    return seen


def error_names(exc: BaseException) -> str:
    """The types in ``exc``'s chain of causes and its HTTP status, none of its text: what is kept of a failure whose
    words are the model's (an answer that did not parse) or the provider's (a refusal may quote the key)."""
    causes = _chain(exc, context=False)  # the context of a failed call is asyncio's
    names = ", ".join(dict.fromkeys(type(c).__name__ for c in causes))
    status = next(
        (
            s
            for c in _chain(exc)
            for s in (getattr(c, "status_code", None), getattr(c, "status", None))
            if isinstance(s, int)
        ),
        None,
    )
    return f"{names} (HTTP {status})" if status else names


def classify_error(exc: BaseException) -> tuple[str, str]:
    """``(kind, why)`` of a failed call: ``auth``, ``fatal`` (cannot change: HTTP 404, context window
    exceeded, unknown provider), ``no_tools`` (the provider refuses tool calls), ``timeout``,
    ``unparseable`` (an answer that gave no candidate) or ``failed`` (no answer: 5xx, connection)."""
    chain = _chain(exc)
    names = " ".join(type(e).__name__ for e in chain)
    text = " ".join(str(e) for e in chain)[:2000]
    low = text.lower()
    status = next(
        (
            s
            for e in chain
            for s in (getattr(e, "status_code", None), getattr(e, "status", None))
            if isinstance(s, int)
        ),
        None,
    )
    if "AdapterParseError" in names or "ValidationError" in names:  # its text is the model's: not read
        return "unparseable", "the answer could not be parsed"
    if isinstance(exc, PlannerTimeout) or "Timeout" in names or "timed out" in low:
        return "timeout", "timeout"
    if is_auth_error(exc) or status in (401, 403) or "LMAuthError" in names:
        return "auth", "the provider refused the credentials"
    if "ContextWindowExceeded" in names or _CONTEXT_ERROR.search(low):
        return "fatal", f"{CONTEXT_WHY} (raise the server's context size or lower llm.max_prompt_tokens)"
    if "LLM Provider NOT provided" in text or "provider not provided" in low:
        return (
            "fatal",
            "unknown provider in the model string (use e.g. openai/<name> with --llm-api-base, ollama/<name>)",
        )
    if status == 404 or "NotFound" in names:
        return (
            "fatal",
            "HTTP 404: the model or the URL does not exist on the server (an api_base usually ends in /v1)",
        )
    if status == 400 and "tool" in low:
        return "no_tools", "the provider refuses tool calls"
    if "failed to produce final outputs" in low:  # ReActV2: no submit after a parse failure
        return "unparseable", "the answer could not be parsed"
    if "connection refused" in low or any(isinstance(e, ConnectionRefusedError) for e in chain):
        return "failed", "connection refused: is the server running at that address and port?"
    return "failed", "no answer"


CONTEXT_WHY = "the prompt does not fit the model's context window"
_CONTEXT_ERROR = re.compile(
    r"context (length|window)|maximum context|context size has been exceeded|exceeds? the available context"
    r"|exceed_context_size|prompt (is )?too long|input length exceeds|exceeds? (the )?(max(imum)? )?context"
)
"""a provider's words for a prompt that does not fit: OpenAI / vLLM ("maximum context length"), llama.cpp
("the request exceeds the available context size", "Context size has been exceeded"), Ollama ("input length
exceeds the context length", "prompt too long")"""


class PlannerTimeout(Exception):
    """The planner call's ``llm.timeout_s`` is spent (raised before a further LM request)."""


class PlannerLM(dspy.LM):
    """``dspy.LM`` with a deadline for the whole planner call (each request gets what is left) and native
    tool calls declared for an OpenAI-compatible server (LiteLLM's map does not know local models)."""

    native_tools: bool = False
    deadline: float | None = None

    @property
    def supports_function_calling(self) -> bool:  # type: ignore[override]
        return self.native_tools or super().supports_function_calling

    def __call__(self, prompt: Any = None, *, messages: Any = None, **kwargs: Any) -> Any:
        if self.deadline is not None:
            left = self.deadline - time.monotonic()
            if left <= 0:
                raise PlannerTimeout("llm.timeout_s spent")
            full = float(kwargs.get("timeout") or self.kwargs.get("timeout") or left)
            if left < full - 1.0:  # whole seconds: the first request keeps its cache key (reruns replay)
                kwargs["timeout"] = float(max(1, int(left)))
        return super().__call__(prompt, messages=messages, **kwargs)


class PlannerAdapter(dspy.JSONAdapter):
    """DSPy's JSON adapter with the study's answer schema as ``response_format``, the chat format as the
    parse fallback (no second call), and optionally the system message folded into the user message."""

    def __init__(self, *, fmt: dict[str, Any] | None, fold_system: bool, native_tools: bool) -> None:
        super().__init__(use_native_function_calling=native_tools)
        self.fmt, self.fold_system = fmt, fold_system
        self._chat = dspy.ChatAdapter(use_json_adapter_fallback=False)

    def _prepare_response_format(self, lm: Any, lm_kwargs: dict[str, Any], signature: Any) -> None:
        if self.fmt is not None and (
            "candidates" in signature.output_fields or "choices" in signature.output_fields
        ):
            lm_kwargs["response_format"] = self.fmt

    def format(self, signature: Any, demos: Any, inputs: Any) -> list[dict[str, Any]]:
        messages = super().format(signature, demos, inputs)
        if self.fold_system and messages and messages[0].get("role") == "system":
            system = messages.pop(0)["content"]
            for m in messages:
                if m.get("role") == "user" and isinstance(m.get("content"), str):
                    m["content"] = f"{system}\n\n{m['content']}"
                    break
        return messages

    def parse(self, signature: Any, completion: str) -> dict[str, Any]:
        try:
            return super().parse(signature, completion)
        except Exception:
            return self._chat.parse(signature, completion)


def is_local(api_base: str | None) -> bool:
    """Whether ``api_base`` is a server on this machine (localhost or a loopback address)."""
    if not api_base:
        return False
    import ipaddress
    from urllib.parse import urlsplit

    host = (urlsplit(api_base).hostname or "").lower()
    if host in ("localhost", "localhost.localdomain") or host.endswith(".localhost"):
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False


class _DropTruncationWarning(logging.Filter):
    """DSPy's "LM response was truncated ..." names its own ``max_tokens`` and ``dspy.inspect_history()``; the
    planner reports the same fact as ``llm.max_tokens`` (:func:`truncated`), so DSPy's line is dropped."""

    def filter(self, record: logging.LogRecord) -> bool:
        return not str(record.msg).startswith("LM response was truncated")


logging.getLogger("dspy.clients.lm").addFilter(_DropTruncationWarning())


def truncated(entry: dict[str, Any]) -> bool:
    """Whether one DSPy history entry's answer stopped at the token limit (``finish_reason == "length"``)."""
    response = entry.get("response")
    choices = getattr(response, "choices", None)
    if choices is None and isinstance(response, dict):
        choices = response.get("choices")
    reasons = [getattr(response, "finish_reason", None)] + [
        c.get("finish_reason") if isinstance(c, dict) else getattr(c, "finish_reason", None)
        for c in choices or []
    ]
    return "length" in reasons


def refused(api_base: str | None) -> bool:
    """Whether nothing listens at ``api_base``'s host and port (LiteLLM reports a refused connection as a
    plain "Connection error")."""
    if not api_base:
        return False
    import socket
    from urllib.parse import urlsplit

    url = urlsplit(api_base)
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        socket.create_connection((url.hostname or "localhost", port), timeout=2).close()
    except ConnectionRefusedError:
        return True
    except OSError:
        return False
    return False


def supports_tools(model: str) -> bool:
    """Whether LiteLLM's model map says ``model`` calls tools (``False`` when it does not know it)."""
    import litellm

    litellm.suppress_debug_info = True  # no "Provider List" banner for a model it does not know
    try:
        return bool(litellm.supports_function_calling(model=model))
    except Exception:
        return False
