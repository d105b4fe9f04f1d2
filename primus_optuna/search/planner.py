"""The LLM planner: a DSPy module that proposes cross-axis configurations the one-axis sweep could not test.

A :class:`ProposeConfigs` signature (typed pydantic outputs) runs under ``dspy.ChainOfThought``; the language
model is a ``dspy.LM(model, engine="litellm")`` used inside ``dspy.context`` (so any LiteLLM provider string
works and Optuna's worker threads are safe). Every candidate is checked in code by the caller's ``validate``
(legal, fits in memory, not tried or queued); rejected ones are recorded with their reason.

Each call stores a transcript (prompt inputs, messages, raw outputs, usage, accepted/rejected) as a study
artifact when an artifact store is given, and adds its tokens and cost to the study user attrs ``llm_calls``,
``llm_tokens`` and ``llm_cost_usd``; ``llm.max_calls`` / ``llm.max_cost_usd`` are enforced from those attrs, so
the budget survives restarts and is shared by workers. The DSPy disk cache lives next to the storage so a
rerun replays the same answers. API keys come from the environment only (LiteLLM's usual variables, or the
one named by ``llm.api_key_env``) and are scrubbed from transcripts.

This module imports DSPy; import it only when a planner is configured.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import dspy
import optuna
from pydantic import BaseModel, Field

from ..errors import SpecError
from ..redaction import redact
from ..space import Space, TrainingConfig
from ..space.rules import RULES
from ..spec import StudySpec
from ..spec.study import LLMSpec

log = logging.getLogger(__name__)

Validate = Callable[[dict[str, Any]], "tuple[TrainingConfig | None, str]"]
"""candidate axes -> (accepted canonical config, "") or (None, rejection reason)"""

MAX_TRIED_LISTED = 80
N_BEST = 8
N_FAILED = 6
_cache_lock = threading.Lock()
_configured_cache: str | None = None


class Candidate(BaseModel):
    """One proposed configuration (values are checked in code, so unknown strings parse and are rejected)."""

    tp: int
    pp: int
    ep: int = 1
    cp: int = 1
    vpp: int = 1
    mbs: int = 1
    recompute: str = "none"
    moe_dispatcher: str = "alltoall"
    pp_schedule: str = "1f1b"
    ep_overlap: bool = False
    rationale: str = Field(
        default="", description="one or two sentences: why this should beat the best so far"
    )


class ProposeConfigs(dspy.Signature):
    """You tune the distributed layout of a Megatron-Core LLM pre-training job to maximise training
    throughput (tokens per second per GPU). A one-axis-at-a-time sweep around a baseline has been measured.
    Propose new full configurations likely to beat the best so far, especially combinations of axes the sweep
    could not test together (e.g. MoE dispatcher x pipeline schedule x recompute x micro-batch). Use only the
    legal values, satisfy every coupling rule, keep the peak memory under the usable memory, never repeat a
    tried configuration, and give each candidate a short rationale grounded in the evidence."""

    study: str = dspy.InputField(desc="model, cluster and workload")
    legal_values: str = dspy.InputField(desc="JSON: the values each axis may take")
    coupling_rules: str = dspy.InputField(desc="rules every configuration must satisfy")
    sweep_effects: str = dspy.InputField(desc="one-axis sweep: per axis, value -> tokens/s/GPU or why pruned")
    best_trials: str = dspy.InputField(desc="best trials so far (estimate, measurement, memory) and failures")
    tried: str = dspy.InputField(desc="configuration keys already tried or queued: do not repeat them")
    n_candidates: int = dspy.InputField(desc="how many candidates to return")
    candidates: list[Candidate] = dspy.OutputField(desc="new configurations, best first")


@dataclass
class PlannerOutcome:
    """What one planner call produced."""

    accepted: list[tuple[TrainingConfig, str]] = field(default_factory=list)
    rejected: list[dict[str, Any]] = field(default_factory=list)
    error: str | None = None
    called: bool = False
    tokens: int = 0
    cost_usd: float = 0.0
    artifact_id: str | None = None


def configure_cache(cache_dir: str | Path) -> None:
    """Put DSPy's disk cache in ``cache_dir`` (once per process and directory)."""
    global _configured_cache
    with _cache_lock:
        if _configured_cache == str(cache_dir):
            return
        Path(cache_dir).mkdir(parents=True, exist_ok=True)
        dspy.configure_cache(enable_disk_cache=True, enable_memory_cache=True, disk_cache_dir=str(cache_dir))
        _configured_cache = str(cache_dir)


def _json(x: Any) -> str:
    return json.dumps(x, separators=(", ", ": "), default=str)


class Planner:
    """Builds prompts from the study's storage, calls the LM, validates candidates, keeps the books."""

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
    ) -> None:
        self.spec, self.space = spec, space
        self.artifact_store = artifact_store
        self.usable_gib = usable_gib
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
            env = self.settings.api_key_env
            if env:
                if not os.environ.get(env):
                    raise SpecError(f"llm.api_key_env names {env!r} but that environment variable is not set")
                self._api_key = os.environ[env]
        self.api_base = api_base or self.settings.api_base
        self.cache = cache_dir is not None
        """without a cache directory nothing is cached (not even in memory), so every call reaches the LM"""
        if cache_dir is not None:
            configure_cache(cache_dir)
        self.module = dspy.ChainOfThought(ProposeConfigs)
        self.adapter = dspy.ChatAdapter(use_json_adapter_fallback=False)

    # --- the language model --------------------------------------------------------------------------------
    def make_lm(self) -> dspy.BaseLM:
        """A fresh ``dspy.LM`` routed through LiteLLM (or the injected LM)."""
        if self._lm is not None:
            return self._lm
        s = self.settings
        kwargs: dict[str, Any] = {}
        if self.api_base:
            kwargs["api_base"] = self.api_base
        if self._api_key:
            kwargs["api_key"] = self._api_key
        return dspy.LM(
            s.model,
            engine="litellm",
            temperature=s.temperature,
            max_tokens=s.max_tokens,
            num_retries=s.num_retries,
            timeout=s.timeout_s,
            cache=self.cache,
            **kwargs,
        )

    # --- budget ------------------------------------------------------------------------------------------
    def budget_exhausted(self, study: optuna.Study) -> str | None:
        """Why no further call may be made (``None`` while within ``llm.max_calls`` / ``llm.max_cost_usd``)."""
        attrs = study._storage.get_study_user_attrs(study._study_id)
        calls, cost = int(attrs.get("llm_calls", 0)), float(attrs.get("llm_cost_usd", 0.0))
        if calls >= self.settings.max_calls:
            return f"llm.max_calls={self.settings.max_calls} reached"
        if self.settings.max_cost_usd is not None and cost >= self.settings.max_cost_usd:
            return f"llm.max_cost_usd={self.settings.max_cost_usd} reached (spent {cost:.4f})"
        return None

    # --- prompt ------------------------------------------------------------------------------------------
    def inputs(self, trials: list[optuna.trial.FrozenTrial], n: int, tried: list[str]) -> dict[str, Any]:
        spec, m, g = self.spec, self.spec.model, self.spec.cluster.gpu
        moe = (
            f", MoE {m.experts} experts top-{m.moe_router_topk} (expert FFN {m.expert_ffn})"
            if m.is_moe
            else ""
        )
        mem = f"; usable memory per GPU ≈ {self.usable_gib:.1f} GiB" if self.usable_gib else ""
        study = (
            f"model {m.name}: {m.num_layers} layers, hidden {m.hidden_size}, FFN {m.ffn_hidden_size}, "
            f"{m.num_attention_heads} heads / {m.query_groups} KV groups, vocab {m.vocab_size}{moe}. "
            f"cluster: {spec.cluster.nodes} nodes x {spec.cluster.gpus_per_node} {g.name} "
            f"({g.hbm_gib:.1f} GiB device memory, {g.bf16_tflops} bf16 TFLOPS, {g.fp8_tflops} fp8 TFLOPS, topology {g.topology}). "
            f"workload: seq {spec.workload.seq_length}, global batch {spec.workload.global_batch_size}, "
            f"{spec.workload.precision}, distributed optimizer {spec.workload.distributed_optimizer}{mem}."
        )
        rules = "\n".join(f"- {r.text}" for r in RULES) + (
            "\n- world = tp·cp·pp·dp; micro-batches = global_batch / (mbs·dp)"
        )
        return {
            "study": study,
            "legal_values": _json(self.space.legal_values()),
            "coupling_rules": rules,
            "sweep_effects": _json(sweep_effects(trials)),
            "best_trials": _json(best_trials(trials, self.spec.search.multi_objective)),
            "tried": ", ".join(tried[-MAX_TRIED_LISTED:]) or "(none)",
            "n_candidates": n,
        }

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
    ) -> PlannerOutcome:
        """Ask the LM for ``n`` candidates and validate them; never raises for LM or parse failures."""
        out = PlannerOutcome()
        exhausted = self.budget_exhausted(study)
        if exhausted:
            out.error = exhausted
            return out
        inputs = self.inputs(trials, n, tried)
        lm = self.make_lm()
        start = len(getattr(lm, "history", []))
        raw: list[dict[str, Any]] = []
        t0 = time.perf_counter()
        out.called = True
        try:
            with dspy.context(lm=lm, adapter=self.adapter), dspy.track_usage() as tracker:
                pred = self.module(**inputs)
            usage = tracker.get_total_tokens()
            out.tokens = int(sum(u.get("total_tokens") or 0 for u in usage.values()))
            for c in pred.candidates or []:
                raw.append(c.model_dump() if isinstance(c, BaseModel) else dict(c))
            reasoning = str(getattr(pred, "reasoning", ""))
        except Exception as exc:  # LMError, AdapterParseError, timeouts, anything from the provider
            out.error = redact(f"{type(exc).__name__}: {exc}", values=[self._api_key])[:800]
            reasoning = ""
            log.warning("planner call failed, falling back: %s", out.error)
        history = list(getattr(lm, "history", [])[start:])
        out.cost_usd = float(sum((h.get("cost") or 0.0) for h in history if h.get("usage")))
        seen: set[TrainingConfig] = set()
        for cand in raw:
            # the LM's words go to storage, notes and reports: no secret it may echo gets through
            rationale = redact(str(cand.pop("rationale", "") or ""), values=[self._api_key])
            config, reason = validate(cand)
            if config is not None and config in seen:
                config, reason = None, "duplicate: proposed twice in this answer"
            if config is None:
                out.rejected.append({"candidate": cand, "rationale": rationale, "reason": reason})
            else:
                seen.add(config)
                out.accepted.append((config, rationale))
        if out.error is None and not raw:
            out.error = "the LM returned no candidate"
        self._account(study, out)
        transcript = {
            "kind": "primus-optuna planner transcript",
            "model": self.model,
            "trial_number": trial_number,
            "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
            "elapsed_s": round(time.perf_counter() - t0, 3),
            "inputs": inputs,
            "reasoning": reasoning,
            "messages": [h.get("messages") for h in history],
            "outputs": [h.get("outputs") for h in history],
            "usage": [h.get("usage") for h in history],
            "cost_usd": out.cost_usd,
            "tokens": out.tokens,
            "accepted": [{"config": c.to_params(), "key": c.key(), "rationale": r} for c, r in out.accepted],
            "rejected": out.rejected,
            "error": out.error,
        }
        out.artifact_id = self._store(study, transcript)
        return out

    def _account(self, study: optuna.Study, out: PlannerOutcome) -> None:
        storage, sid = study._storage, study._study_id
        attrs = storage.get_study_user_attrs(sid)
        storage.set_study_user_attr(sid, "llm_calls", int(attrs.get("llm_calls", 0)) + 1)
        storage.set_study_user_attr(sid, "llm_tokens", int(attrs.get("llm_tokens", 0)) + out.tokens)
        storage.set_study_user_attr(
            sid, "llm_cost_usd", round(float(attrs.get("llm_cost_usd", 0.0)) + out.cost_usd, 6)
        )
        storage.set_study_user_attr(
            sid, "llm_rejected", int(attrs.get("llm_rejected", 0)) + len(out.rejected)
        )

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


# --- evidence for the prompt, read from trials ---------------------------------------------------------
def _summary(t: optuna.trial.FrozenTrial) -> dict[str, Any]:
    ua = t.user_attrs
    d: dict[str, Any] = {"config": ua.get("config_key"), "state": t.state.name}
    if t.values:
        d["tokens_per_s_per_gpu"] = round(t.values[0], 1)
    for k in ("estimate_tokens_per_s_per_gpu", "measured_tokens_per_s_per_gpu", "memory_peak_gib"):
        if ua.get(k) is not None:
            d[k.removesuffix("_tokens_per_s_per_gpu")] = round(float(ua[k]), 1)
    for k in ("prune_reason", "failure_reason", "phase"):
        if ua.get(k):
            d[k] = str(ua[k])[:160]
    return d


def sweep_effects(trials: list[optuna.trial.FrozenTrial]) -> dict[str, dict[str, Any]]:
    """Per swept axis: value -> tokens/s/GPU (or the prune/failure reason); ``baseline`` for the centre."""
    out: dict[str, dict[str, Any]] = {}
    for t in trials:
        ua = t.user_attrs
        if ua.get("phase") != "sweep" or "sweep_axis" not in ua:
            continue
        axis, value = ua["sweep_axis"], str(ua.get("sweep_value"))
        if t.state == optuna.trial.TrialState.COMPLETE and t.values:
            res: Any = round(t.values[0], 1)
        else:
            res = str(ua.get("prune_reason") or ua.get("failure_reason") or t.state.name)[:120]
        out.setdefault(axis, {})[value] = res
    return out


def best_trials(trials: list[optuna.trial.FrozenTrial], multi: bool) -> dict[str, Any]:
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and t.values]
    done.sort(key=lambda t: -t.values[0])
    bad = [
        t
        for t in trials
        if t.state in (optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)
        and not str(t.user_attrs.get("prune_reason", "")).startswith("duplicate")
    ]
    return {
        "best": [_summary(t) for t in done[:N_BEST]],
        "pruned_or_failed": [_summary(t) for t in bad[-N_FAILED:]],
        "objective": "maximise tokens/s/GPU" + (" and minimise peak memory (Pareto)" if multi else ""),
    }
