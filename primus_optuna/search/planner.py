"""The LLM planner: proposes cross-axis configurations the one-axis sweep could not test.

Three modes (``llm.mode``; their DSPy signatures are in :mod:`~primus_optuna.search.planner_prompt`):

- **agent** (``PlanWithTools`` under ``dspy.ReActV2``): the model calls the library's own tools
  (:mod:`~primus_optuna.search.planner_tools`: ``check``, ``estimate``, ``history``, ``best``,
  ``legal_values``, ``budget``, ``top_untried``, ``note``/``notes``) before it submits a ranked list of
  candidates. Native OpenAI tool calls where the provider supports them (LiteLLM's model map, or any server
  given with ``api_base`` when ``llm.mode: agent``), DSPy's text tool-call format otherwise. A server given
  with ``api_base`` is first asked for one call of a trivial tool (:meth:`Planner.probe_tools`): one that
  answers in prose (llama.cpp without ``--jinja`` drops ``tools``) turns the planner to rank mode, with a
  message naming ``--jinja`` and tool-capable chat templates; a provider that refuses tools turns it one-shot.
- **oneshot** (``ProposeConfigs`` under ``dspy.Predict``: the candidates first, each with a short reason,
  then a bounded reasoning, so an answer cut at ``llm.max_tokens`` still holds them): one answer from a
  context dump, compacted to ``llm.max_prompt_tokens`` (the top trials, then the legal values, then the sweep
  effects are dropped first).
- **rank** (``RankCandidates``): the model chooses and justifies, by number, among the fallback's best
  untried configurations by expected improvement (:meth:`~primus_optuna.search.fallback.Judge.shortlist`), so
  it cannot propose worse than them. ``auto`` is rank for a server on this machine
  (:func:`~primus_optuna.search.llm_client.is_local`), agent when LiteLLM knows the model calls tools, else
  one-shot.

Whatever the mode, a candidate is launched only when the fallback's acquisition finds it worth a launch
(:class:`~primus_optuna.search.fallback.Judge`); else it is rejected with its figure ("expected 1,700
tokens/s/GPU (±8%), 32% of the best ...: not worth a launch"), and the next call is told
(:func:`~primus_optuna.search.llm_budget.feedback`).

Answers are constrained by a JSON schema whose axis fields are enums of the study's legal values
(:mod:`~primus_optuna.search.planner_schema`: ``response_format`` ``json_schema`` or llama-cpp-python's
``json_object`` + ``schema``), parsed by DSPy's JSON adapter with the chat format as the fallback (no extra
call). Every candidate is checked in code by the caller's ``validate`` (legal, fits, not tried or queued); a
near miss one axis from legal is repaired first and says so in its rationale.

Budgets are enforced in code before a call is made: ``llm.max_calls`` is reserved atomically in the study's
storage (:mod:`~primus_optuna.search.llm_budget`, safe with ``n_jobs`` and many processes), no call starts
once ``llm.max_cost_usd`` is spent, an agent call makes at most ``llm.max_tool_calls`` tool calls and stops
at ``llm.timeout_s``. The planner stops for the rest of the run at once on errors that cannot change
(refused credentials, HTTP 404, context window exceeded, unknown provider), after ``llm.max_unparseable``
unparseable answers or :data:`MAX_FAILED_IN_A_ROW` unanswered calls in a row; the reason is kept in the
study (:func:`~primus_optuna.search.llm_budget.llm_accounting`). With an ``api_base`` (a local server)
answers are streamed (``dspy.streamify`` under ``asyncio.timeout``), so a call cut at its deadline closes
the connection and the server stops generating, and a timed-out request is not retried.

Token counts are the server's (``track_usage``: a streamed request asks for ``include_usage``). The model's
own words are never printed or logged (a parse error names its type only); rationales are cut and stripped of
control characters (:func:`~primus_optuna.search.planner_schema.sanitise`). DSPy's cache (with a cache
directory; with an ``api_base`` only when ``llm.cache``) keeps only answers that parsed.

Each call stores a transcript (inputs, messages, raw outputs, every tool call and its result, usage,
accepted/rejected) as a study artifact; keys are scrubbed from it. The connection itself (the key check, what a
failed call means, the cache, the deadline, the adapter) is :mod:`~primus_optuna.search.llm_client`; what the
model is told (the signatures and each mode's inputs) is :mod:`~primus_optuna.search.planner_prompt`. This
module imports DSPy; import it only when a planner is configured.
"""

from __future__ import annotations

import asyncio
import json
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dspy
import optuna
from pydantic import BaseModel

from ..errors import SpecError
from ..redaction import redact
from ..space import Space, TrainingConfig
from ..spec import StudySpec
from ..spec.study import DEFAULT_TEMPERATURE, LLMSpec
from . import llm_budget
from .llm_budget import llm_accounting
from .llm_client import (
    CONTEXT_WHY,
    KEY_WANTED,
    NO_KEY,
    PlannerAdapter,
    PlannerLM,
    PlannerTimeout,
    api_key,
    classify_error,
    configure_cache,
    error_names,
    forget_since,
    is_local,
    refused,
    stored_keys,
    supports_tools,
    truncated,
)
from .llm_preflight import context_needed
from .logs import get_logger
from .planner_prompt import (
    RANK_CHOICES,
    PlanWithTools,
    PromptBuilder,
    ProposeConfigs,
    RankCandidates,
    as_json,
)
from .planner_schema import (
    REASONING_CHARS,
    answer_schema,
    candidate_schema,
    no_reason,
    prompt_text,
    rank_schema,
    repair_near_miss,
    response_format,
    sanitise,
)
from .planner_tools import PlannerTools
from .state import set_study_state

log = get_logger(__name__)

__all__ = ["Planner", "PlannerOutcome", "llm_accounting"]

Validate = Callable[[dict[str, Any]], "tuple[TrainingConfig | None, str]"]
"""candidate axes -> (accepted canonical config, "" or a note added to its rationale, e.g. its expected
figure) or (None, rejection reason)"""

MAX_FAILED_IN_A_ROW = 3
"""calls with no answer (timeouts, 5xx) in a row after which this process's planner stops"""
PROBE_TOOL = "primus_tool_probe"
"""the tool an agent's server is asked to call once before the first agent call"""


@dataclass
class PlannerOutcome:
    """What one planner call produced."""

    accepted: list[tuple[TrainingConfig, str]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    called: bool = False
    """whether a call was reserved and made (every one counts against ``llm.max_calls``)"""
    answered: bool = True
    """whether the provider answered (a call with no answer is counted as ``failed``)"""
    tokens: int = 0
    cost_usd: float = 0.0
    artifact_id: str | None = None
    mode: str = "oneshot"
    """``agent``, ``oneshot`` or ``rank``"""
    unparseable: bool = False
    """answered, but no candidate could be read from the answer"""
    tool_calls: int = 0
    repaired: int = 0
    truncated: int = 0
    """answers that stopped at ``llm.max_tokens``"""
    stop_reason: str | None = None
    """why this planner makes no further call (set on the call that stopped it)"""
    deferred: bool = False
    """rank mode left the decision to the fallback (its own pick is below the gate), making no call"""


class _Agent(dspy.ReActV2):
    """ReActV2 whose ``submit`` tool takes candidates constrained to the study's legal values."""

    def __init__(self, tools: list[Any], max_iters: int, item_schema: dict[str, Any]) -> None:
        self._item_schema = item_schema
        super().__init__(PlanWithTools, tools=tools, max_iters=max_iters)

    def _make_submit_tool(self) -> dspy.Tool:
        def submit(candidates: list[dict[str, Any]]) -> dict[str, Any]:
            return {"candidates": candidates}

        return dspy.Tool(
            submit,
            name="submit",
            desc="Submit the final ranked list of candidates (best first), each with a short rationale.",
            args={"candidates": {"type": "array", "items": self._item_schema}},
            arg_types={"candidates": list[dict[str, Any]]},
        )


def _picked(choices: Sequence[Any], shortlist: Sequence[tuple[Any, Any]]) -> list[dict[str, Any]]:
    """Rank-mode choices as candidates: the shortlisted configuration and the choice's reason; a number that
    is not on the shortlist stays ``{"pick": n}`` (rejected)."""
    out = []
    for ch in choices:
        d = ch.model_dump() if isinstance(ch, BaseModel) else dict(ch)
        pick = d.get("pick")
        if isinstance(pick, int) and 1 <= pick <= len(shortlist):
            out.append({**shortlist[pick - 1][0].config.to_params(), "rationale": d.get("rationale", "")})
        else:
            out.append({"pick": pick, "rationale": d.get("rationale", "")})
    return out


def _key_of(space: Space, params: dict[str, Any]) -> str:
    """A rejected candidate's configuration key (its JSON when it is not a configuration)."""
    try:
        return space.canonical(TrainingConfig.from_params(params)).key()
    except Exception:
        return as_json(params)[:160]


def _loop_running() -> bool:
    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return False
    return True


class Planner:
    """Builds prompts from the study's storage, calls the LM (agent or one-shot), validates candidates,
    keeps the books."""

    def __init__(
        self,
        spec: StudySpec,
        space: Space,
        llm: str | LLMSpec | dspy.BaseLM,
        *,
        api_base: str | None = None,
        artifact_store: Any = None,
        cache_dir: str | Path | None = None,
        usable_gib: float | None = None,
        fallback: Any = None,
    ) -> None:
        self.spec, self.space = spec, space
        self.artifact_store = artifact_store
        self.usable_gib = usable_gib
        self.fallback = fallback
        """the model-guided proposer (its corrected model answers the ``estimate`` tool)"""
        self._api_key: str | None = None
        if isinstance(llm, dspy.BaseLM):
            self.settings = spec.llm
            self._lm: dspy.BaseLM | None = llm
            self.model = str(getattr(llm, "model", type(llm).__name__))
        else:
            self.settings = llm if isinstance(llm, LLMSpec) else spec.llm.model_copy(update={"model": llm})
            if not self.settings.model:
                raise SpecError("llm.model is empty; pass a LiteLLM model string such as openai/gpt-4o")
            self._lm = None
            self.model = self.settings.model
            self._api_key = api_key(self.settings, api_base or self.settings.api_base)
        self.api_base = api_base or self.settings.api_base
        if self._lm is None:  # import LiteLLM (seconds) now, not inside the first call's llm.timeout_s
            import litellm  # noqa: F401
        s = self.settings
        if s.mode == "auto":
            self.mode = (
                "rank"
                if is_local(self.api_base)
                else ("agent" if self._lm is None and supports_tools(self.model) else "oneshot")
            )
        else:
            self.mode = s.mode
        self.tools_probed = self._lm is not None or self.api_base is None
        """an agent on a server given by api_base is first asked for one tool call (:meth:`probe_tools`)"""
        self.native_tools = (
            self.mode == "agent"
            and self._lm is None
            and (self.api_base is not None or supports_tools(self.model))
        )
        self.stopped: str | None = None
        """why this planner makes no further call in this process"""
        self._failed_in_a_row = 0
        self._unparseable_in_a_row = 0
        self._recorded_stop: str | None = None
        self._started = False
        self._lock = threading.Lock()
        self.cache = cache_dir is not None and (s.cache if s.cache is not None else self.api_base is None)
        """without a cache directory nothing is cached (not even in memory), so every call reaches the LM; with
        an api_base (a local server, whose answers may change with its settings) only when ``llm.cache``"""
        if self.cache:
            configure_cache(cache_dir)
        self.module = dspy.Predict(ProposeConfigs)
        self.ranker = dspy.Predict(RankCandidates)
        """candidates first, then a bounded reasoning (a chain of thought first used up small models' tokens)"""
        kind = "json_schema" if s.response_format == "auto" else s.response_format
        self.response_kind = kind
        budget = s.prompt_budget(local=self.api_base is not None, agent=self.mode == "agent")
        self.prompt = PromptBuilder(spec, space, usable_gib, budget)
        """each mode's inputs, within the tokens a prompt may take (``llm.max_prompt_tokens`` or its default)"""
        self.stream = self._lm is None and (s.stream if s.stream is not None else self.api_base is not None)
        """stream the answers: a request abandoned at the deadline closes its connection, so the server stops"""

    # --- the language model --------------------------------------------------------------------------------
    @property
    def temperature(self) -> float:
        """``llm.temperature``, or when unset 0 in rank mode and :data:`~primus_optuna.spec.study.DEFAULT_TEMPERATURE` in the others."""
        t = self.settings.temperature
        return t if t is not None else (0.0 if self.mode == "rank" else DEFAULT_TEMPERATURE)

    def make_lm(self, deadline: float | None = None) -> dspy.BaseLM:
        """A fresh ``dspy.LM`` routed through LiteLLM (or the injected LM)."""
        if self._lm is not None:
            return self._lm
        s = self.settings
        kwargs: dict[str, Any] = {}
        if self.api_base:
            kwargs["api_base"] = self.api_base
        if self._api_key:
            kwargs["api_key"] = self._api_key
        lm = PlannerLM(
            s.model,
            engine="litellm",
            temperature=self.temperature,
            max_tokens=s.max_tokens,
            # a local server (api_base) is not asked again after a timeout: it may still be generating
            num_retries=0 if self.api_base else s.num_retries,
            timeout=s.timeout_s,
            cache=self.cache,
            **kwargs,
        )
        lm.native_tools = self.native_tools
        lm.deadline = deadline
        return lm

    def adapter(self, n: int, k: int = 0) -> PlannerAdapter:
        """The adapter of one call (``k``: the rank mode's shortlist length)."""
        schema = rank_schema(k, n) if self.mode == "rank" else answer_schema(self.space, n, reasoning=True)
        fmt = None if self.mode == "agent" else response_format(schema, self.response_kind)
        return PlannerAdapter(
            fmt=fmt, fold_system=self.settings.fold_system_prompt, native_tools=self.mode == "agent"
        )

    # --- budget ------------------------------------------------------------------------------------------
    def budget_exhausted(self, study: optuna.Study) -> str | None:
        """Why no further call may be made (``None`` while within budget); reads the study's books."""
        if self.stopped:
            return self.stopped
        books = llm_accounting(study)
        if books["calls"] >= self.settings.max_calls:
            return f"llm.max_calls={self.settings.max_calls} reached"
        cap = self.settings.max_cost_usd
        if cap is not None and books["cost_usd"] >= cap:
            return f"llm.max_cost_usd={cap} reached (spent {books['cost_usd']:.4f})"
        return None

    def _budget_view(self, study: optuna.Study) -> dict[str, Any]:
        books = llm_accounting(study)
        out: dict[str, Any] = {"planner_calls_left": max(0, self.settings.max_calls - books["calls"])}
        if self.settings.max_cost_usd is not None:
            out["usd_left"] = round(max(0.0, self.settings.max_cost_usd - books["cost_usd"]), 4)
        return out

    def _stop(self, study: optuna.Study, why: str) -> None:
        self.stopped = why
        set_study_state(study, llm_budget.STOP, why)

    # --- prompt ------------------------------------------------------------------------------------------
    def probe_tools(self) -> str | None:
        """Ask the server at ``api_base`` for one call of a trivial tool: ``None`` when it makes it, else why
        not (a server that drops ``tools``, as llama.cpp's does without ``--jinja`` or with a chat template
        that has no tool support, answers in prose)."""
        import litellm

        kwargs: dict[str, Any] = {"api_base": self.api_base}
        if self._api_key:
            kwargs["api_key"] = self._api_key
        tool = {
            "type": "function",
            "function": {
                "name": PROBE_TOOL,
                "description": "Report that tool calls work.",
                "parameters": {
                    "type": "object",
                    "properties": {"ok": {"type": "boolean"}},
                    "required": ["ok"],
                },
            },
        }
        try:
            resp = litellm.completion(
                model=self.settings.model,
                messages=[{"role": "user", "content": f"Call the tool {PROBE_TOOL} with ok=true."}],
                tools=[tool],
                tool_choice="required",
                max_tokens=64,
                temperature=0.0,
                timeout=min(30.0, self.settings.timeout_s),
                num_retries=0,
                **kwargs,
            )
            calls = resp.choices[0].message.tool_calls or []
        except Exception as exc:
            return f"the tool-call probe failed ({type(exc).__name__})"
        if any(getattr(c.function, "name", None) == PROBE_TOOL for c in calls):
            return None
        return "asked for one tool call, it answered without any"

    def _probe(self, study: optuna.Study) -> None:
        """Probe once; an agent whose server passes no tools goes on in rank mode, and says how to fix it."""
        with self._lock:
            if self.tools_probed:
                return
            self.tools_probed = True
            why = self.probe_tools()
            if why is None:
                return
            self.mode = "rank"
            self.native_tools = False
            msg = (
                f"agent mode needs a server that passes tools; the server at {redact(self.api_base or '')} "
                f"{why}: the planner goes on in rank mode. For llama.cpp's llama-server, start it with --jinja "
                "and a model whose chat template supports tools (or --chat-template-file a tool-capable template)"
            )
            log.warning("%s", msg)
            set_study_state(study, llm_budget.LAST_ERROR, msg)
            set_study_state(study, llm_budget.MODE, self.mode)

    # --- one call ------------------------------------------------------------------------------------------
    def propose(
        self,
        study: optuna.Study,
        trials: list[optuna.trial.FrozenTrial],
        *,
        n: int,
        tried: list[str],
        validate: Validate,
        trial_number: int | None = None,
        ranking: Sequence[Any] = (),
        shortlist: Sequence[tuple[Any, Any]] = (),
        defer: bool = False,
    ) -> PlannerOutcome:
        """Ask the LM for ``n`` candidates and validate them; never raises for LM or parse failures.
        ``shortlist``: the fallback's best untried ``(Ranked, Worth)`` pairs the rank mode chooses among;
        ``defer``: the fallback's own pick is one the gate keeps from the planner, so rank mode makes no call
        and leaves the trial to the fallback (its exploration, which the shortlist cannot hold)."""
        if not self.tools_probed and self.mode == "agent":
            self._probe(study)
        out = PlannerOutcome(mode=self.mode)
        if self.mode == "rank" and defer:
            out.deferred = True
            return out
        if self.mode == "rank" and not shortlist:
            out.error = "nothing untried is worth a launch to choose from"
            return out
        if not self._reserved(study, out):
            return out
        out.called = True
        set_study_state(study, llm_budget.MODEL, self.model)
        set_study_state(study, llm_budget.MODE, self.mode)
        t0 = time.perf_counter()
        deadline = time.monotonic() + self.settings.timeout_s
        lm = self.make_lm(deadline)
        start = len(getattr(lm, "history", []))
        cached = stored_keys()
        if self.mode == "rank":
            n = min(n, RANK_CHOICES)
        adapter = self.adapter(n, len(shortlist))
        tools: PlannerTools | None = None
        raw: list[dict[str, Any]] = []
        reasoning, termination, dropped, prompt_est = "", None, [], 0
        inputs: dict[str, Any] = {}
        kind = "ok"
        try:
            if self.mode == "agent":
                tools = PlannerTools(
                    self.spec,
                    self.space,
                    study,
                    trials,
                    tried=tried,
                    ranking=ranking,
                    fallback=self.fallback,
                    max_tool_calls=self.settings.max_tool_calls,
                    deadline=deadline,
                    budget=lambda: self._budget_view(study),
                    secrets=[self._api_key],
                )
                agent, inputs, prompt_est = self._agent(tools, study, trials, n)
                pred = self._call(agent, inputs, lm, adapter, deadline)
                termination = getattr(pred, "termination_reason", None)
            elif self.mode == "rank":
                inputs = self.prompt.rank_inputs(trials, n, shortlist, llm_budget.feedback(study))
                prompt_est = self.prompt.prompt_tokens(adapter, RankCandidates, inputs)
                pred = self._call(self.ranker, inputs, lm, adapter, deadline)
                reasoning = sanitise(getattr(pred, "reasoning", ""), REASONING_CHARS)
                raw.extend(_picked(pred.choices or [], shortlist))
            else:
                inputs, prompt_est, dropped = self.prompt.compact(
                    adapter, trials, n, tried, ranking, llm_budget.feedback(study)
                )
                pred = self._call(self.module, inputs, lm, adapter, deadline)
                reasoning = sanitise(getattr(pred, "reasoning", ""), REASONING_CHARS)
            for c in getattr(pred, "candidates", None) or []:
                raw.append(c.model_dump() if isinstance(c, BaseModel) else dict(c))
        except Exception as exc:  # LMError, AdapterParseError, timeouts, anything from the provider
            kind = self._failed(study, out, exc, prompt_est)
        if not raw and kind in ("unparseable", "failed"):  # an answer that did not parse is not replayed
            forget_since(cached)
        history = list(getattr(lm, "history", [])[start:])
        out.answered = kind not in ("timeout", "failed", "auth", "fatal", "no_tools") or bool(history)
        out.tokens = int(sum((h.get("usage") or {}).get("total_tokens") or 0 for h in history))
        out.cost_usd = float(sum((h.get("cost") or 0.0) for h in history if h.get("usage")))
        out.tool_calls = tools.used if tools else 0
        self._judge(study, out, raw, kind)
        self._note_truncation(out, history)
        # what the model was shown: the fields, and the messages and answer schema as sent
        sent = [[h.get("messages"), (h.get("kwargs") or {}).get("response_format")] for h in history]
        self._check_candidates(out, raw, validate, n, prompt_text([inputs, sent]))
        llm_budget.add_feedback(
            study, [f"{_key_of(self.space, r['candidate'])}: {r['reason'][:200]}" for r in out.rejected]
        )
        if tools is not None:
            tools.save_notes()
        self._account(study, out)
        transcript = self._transcript(
            out,
            history,
            trial_number=trial_number,
            elapsed_s=time.perf_counter() - t0,
            inputs=inputs,
            prompt_est=prompt_est,
            dropped=dropped,
            reasoning=reasoning,
            tools=tools,
            termination=termination,
        )
        out.artifact_id = self._store(study, transcript)
        return out

    def _reserved(self, study: optuna.Study, out: PlannerOutcome) -> bool:
        """Reserve this call against ``llm.max_calls`` (an earlier run's stop reason cleared first); False,
        with ``out.error`` and the study's stop reason set, when the budget is spent."""
        with self._lock:  # an earlier run's stop reason is over: cleared before this run's first reservation
            if not self._started:
                set_study_state(study, llm_budget.STOP, None)
                self._started = True
        exhausted = self.budget_exhausted(study)
        if exhausted is None and not llm_budget.reserve_call(study, self.settings.max_calls):
            exhausted = f"llm.max_calls={self.settings.max_calls} reached"  # taken by a concurrent worker
        if not exhausted:
            return True
        out.error = exhausted
        if not self.stopped and self._recorded_stop != exhausted:  # once per process and reason
            set_study_state(study, llm_budget.STOP, exhausted)
            self._recorded_stop = exhausted
        return False

    def _agent(
        self, tools: PlannerTools, study: optuna.Study, trials: list[optuna.trial.FrozenTrial], n: int
    ) -> tuple[Any, dict[str, Any], int]:
        """The agent module over ``tools``, its inputs and its prompt's fixed size; the tools' results get
        what ``llm.max_prompt_tokens`` leaves (each result stays in the conversation)."""
        inputs = self.prompt.agent_inputs(study, trials, n)
        agent = _Agent(
            tools.functions(),
            max_iters=self.settings.max_tool_calls + 1,
            item_schema=candidate_schema(self.space),
        )
        specs = [t.format_as_litellm_function_call() for t in agent.tools.values()]
        prompt_est = self.prompt.agent_prompt_tokens(inputs, specs)
        tools.result_chars = self.prompt.chars_left(prompt_est)
        return agent, inputs, prompt_est

    def _failed(
        self, study: optuna.Study, out: PlannerOutcome, exc: BaseException, prompt_est: int = 0
    ) -> str:
        """Record why a call failed (never the model's own words) and stop or switch the planner as its kind
        says; the kind (:func:`classify_error`). ``prompt_est``: the request's estimated prompt tokens."""
        kind, why = classify_error(exc)
        if why.startswith(CONTEXT_WHY) and prompt_est > self.prompt.budget:  # lowering the budget cannot help
            why = (
                f"{CONTEXT_WHY}: this study's {self.mode} prompt is ~{prompt_est:,} tokens at its smallest, more "
                f"than llm.max_prompt_tokens = {self.prompt.budget:,} (start the server with a context of at "
                f"least {context_needed(prompt_est, self.settings.max_tokens):,} tokens, or use rank mode)"
            )
        if kind == "auth" and self._api_key == NO_KEY:
            why += f": {KEY_WANTED}"
        # a parse error's text is the model's answer, a refusal's the provider's (it may quote part of the key):
        # neither is printed or stored, only the type
        text = error_names(exc) if kind in ("unparseable", "auth") else f"{type(exc).__name__}: {exc}"
        detail = redact(sanitise(text, 300), values=[self._api_key])
        if why == "no answer" and "connection error" in detail.lower() and refused(self.api_base):
            why = "connection refused: is the server running at that address and port?"
        out.error = detail if why == "no answer" else f"{why} ({detail})"
        log.warning("planner call failed, falling back: %s", out.error)
        if kind == "auth":
            self._stop(study, f"planner stopped: {why} ({detail[:200]})")
        elif kind == "fatal":
            self._stop(study, f"planner stopped: {why} ({detail[:200]})")
        elif kind == "no_tools":
            self.mode = "oneshot"
            out.error += "; the planner goes on one-shot"
        return kind

    def _transcript(
        self,
        out: PlannerOutcome,
        history: list[dict[str, Any]],
        *,
        trial_number: int | None,
        elapsed_s: float,
        inputs: dict[str, Any],
        prompt_est: int,
        dropped: list[str],
        reasoning: str,
        tools: PlannerTools | None,
        termination: Any,
    ) -> dict[str, Any]:
        """The call's transcript (a study artifact)."""
        return {
            "kind": "primus-optuna planner transcript",
            "model": self.model,
            "mode": out.mode,
            "trial_number": trial_number,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "elapsed_s": round(elapsed_s, 3),
            "inputs": inputs,
            "prompt_tokens_estimate": prompt_est or None,
            "compacted": dropped,
            "reasoning": reasoning,
            "tool_calls": tools.calls if tools else [],
            "notes_added": tools.new_notes if tools else [],
            "termination": termination,
            "messages": [h.get("messages") for h in history],
            "outputs": [h.get("outputs") for h in history],
            "usage": [h.get("usage") for h in history],
            "requests": len(history),
            "cost_usd": out.cost_usd,
            "tokens": out.tokens,
            "accepted": [{"config": c.to_params(), "key": c.key(), "rationale": r} for c, r in out.accepted],
            "rejected": out.rejected,
            "error": out.error,
            "unparseable": out.unparseable,
            "stop_reason": out.stop_reason,
        }

    def _call(
        self, program: Any, inputs: dict[str, Any], lm: Any, adapter: PlannerAdapter, deadline: float
    ) -> Any:
        """Run ``program``; streamed when :attr:`stream`, cancelled (its HTTP stream closed, so the server
        stops generating) when the call's deadline passes."""
        # track_usage: the server's own token counts (a streamed request asks for them, include_usage)
        with dspy.context(lm=lm, adapter=adapter, track_usage=True):
            if not self.stream or _loop_running():
                return program(**inputs)

            async def consume() -> Any:
                pred = None
                async with asyncio.timeout(max(0.05, deadline - time.monotonic())):
                    async for item in dspy.streamify(program)(**inputs):
                        if isinstance(item, dspy.Prediction):
                            pred = item
                return pred

            try:
                pred = asyncio.run(consume())
            except TimeoutError:
                raise PlannerTimeout(f"llm.timeout_s={self.settings.timeout_s:g} spent") from None
            if pred is None:
                raise PlannerTimeout("the streamed answer ended without a result")
            return pred

    def _judge(self, study: optuna.Study, out: PlannerOutcome, raw: list[dict[str, Any]], kind: str) -> None:
        """Count the call as failed (no answer) or unparseable, and stop the planner when these repeat."""
        if not out.answered:
            self._failed_in_a_row += 1
            if self._failed_in_a_row >= MAX_FAILED_IN_A_ROW and not self.stopped:
                self._stop(
                    study,
                    f"planner stopped after {self._failed_in_a_row} calls in a row with no answer "
                    f"(last: {(out.error or '')[:200]})",
                )
        else:
            self._failed_in_a_row = 0
            if not raw and kind == "ok":  # parsed, but an empty list
                out.error = "the LM returned no candidate"
            elif not raw and kind in ("unparseable", "failed"):
                out.unparseable = True
                self._unparseable_in_a_row += 1
                limit = self.settings.max_unparseable
                if self._unparseable_in_a_row >= limit and not self.stopped:
                    self._stop(study, f"planner stopped after {limit} unparseable answers in a row")
            elif raw:
                self._unparseable_in_a_row = 0
        out.stop_reason = self.stopped

    def _note_truncation(self, out: PlannerOutcome, history: list[dict[str, Any]]) -> None:
        """Count the answers that stopped at ``llm.max_tokens`` and say so once, naming the setting."""
        out.truncated = sum(1 for h in history if truncated(h))
        if out.truncated:
            cut = f"the answer stopped at llm.max_tokens = {self.settings.max_tokens:,}: raise llm.max_tokens"
            log.warning("planner: %s", cut)
            out.error = f"{out.error}; {cut}" if out.error else cut

    def _check_candidates(
        self, out: PlannerOutcome, raw: list[dict[str, Any]], validate: Validate, n: int, prompt: str = ""
    ) -> None:
        """Sort the answer's candidates into accepted and rejected; ``prompt``: what the model was shown, so a
        rationale that only repeats it (or itself) is replaced by a note (:func:`no_reason`)."""
        seen: set[TrainingConfig] = set()
        for cand in raw[: max(2 * n, n + 4)]:
            text = str(cand.pop("rationale", "") or "")
            # the LM's words go to storage, notes and reports: no secret it may echo gets through
            rationale = redact(sanitise(no_reason(text, prompt) or text), values=[self._api_key])
            try:
                if "pick" in cand:  # rank mode: a number that is not on the shortlist
                    config, reason = None, f"not on the shortlist: {cand['pick']!r}"
                else:
                    config, reason = validate(cand)
            except Exception as exc:  # a value of the wrong type
                config, reason = None, f"invalid: {type(exc).__name__}: {exc}"[:300]
            if config is None and reason.startswith(("illegal", "outside")):
                fix = repair_near_miss(self.space, cand)
                if fix is not None:
                    fixed, why = validate(fix[0])
                    if fixed is not None:
                        config, reason = fixed, why
                        rationale = f"{rationale} ({fix[1]})".strip()
                        out.repaired += 1
                    elif why.startswith("value"):  # legal once repaired, but not worth a launch
                        reason = f"{why} ({fix[1]})"
            if config is not None and config in seen:
                config, reason = None, "duplicate: proposed twice in this answer"
            if config is None:
                out.rejected.append({"candidate": cand, "rationale": rationale, "reason": reason})
            elif len(out.accepted) < n:  # what was asked for; the rest are not launched
                seen.add(config)
                out.accepted.append((config, f"{rationale} [{reason}]" if reason else rationale))

    def _account(self, study: optuna.Study, out: PlannerOutcome) -> None:
        add = llm_budget.add
        add(study, "answered" if out.answered else "failed", 1)
        if out.unparseable:
            add(study, "unparseable", 1)
        for name, value in (
            ("tokens", out.tokens),
            ("cost_usd", round(out.cost_usd, 6)),
            ("tool_calls", out.tool_calls),
            ("proposed", len(out.accepted) + len(out.rejected)),
            ("accepted", len(out.accepted)),
            ("rejected", len(out.rejected)),
            ("repaired", out.repaired),
            ("truncated", out.truncated),
        ):
            if value:
                add(study, name, value)
        if out.error:
            set_study_state(study, llm_budget.LAST_ERROR, out.error[:400])

    def _store(self, study: optuna.Study, transcript: dict[str, Any]) -> str | None:
        if self.artifact_store is None:
            return None
        text = redact(json.dumps(transcript, indent=1, default=str), values=[self._api_key])
        with tempfile.TemporaryDirectory() as tmp:
            path = Path(tmp) / f"planner-call-{transcript.get('trial_number')}.json"
            path.write_text(text)
            try:
                return optuna.artifacts.upload_artifact(
                    artifact_store=self.artifact_store,
                    file_path=str(path),
                    study_or_trial=study,
                    mimetype="application/json",
                )
            except Exception as exc:  # the artifact store is best-effort; the study goes on
                log.warning("could not store the planner transcript: %s", exc)
                return None
