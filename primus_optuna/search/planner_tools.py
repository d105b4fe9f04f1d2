"""The planner agent's tools: the library's own checks and models, each answering compact JSON.

``check`` (legal, with the rules' reasons), ``estimate`` (memory per stage vs usable, step time and every
one of its terms, each stage's pipeline work, the expectation calibrated by the study's measurements and, once
trials are measured, each term's measured-vs-estimated factor), ``history`` and ``best`` (trials with
their measurements or prune/failure reasons), ``legal_values``, ``budget``, ``top_untried`` (the model-guided
ranking), ``note`` / ``notes`` (the scratchpad kept in the study and carried to the next call).

Every call and its result is appended to :attr:`PlannerTools.calls` (the call's transcript). A call past
``llm.max_tool_calls`` or past the call's deadline runs nothing and answers an error that tells the model to
submit; a tool that raises answers its error (the agent sees it; the study goes on).
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Callable, Sequence
from typing import Any

import optuna

from ..errors import SpecError
from ..physics.calibration import BREAKDOWN_TERMS
from ..physics.memory import estimate_memory
from ..physics.throughput import estimate_throughput
from ..redaction import redact
from ..space import Space, TrainingConfig
from ..spec import StudySpec
from ..spec.study import AXES
from . import llm_budget
from .planner_schema import repair_near_miss
from .pruner import memory_attrs, study_memory_calibration
from .state import set_study_state

MAX_NOTE_CHARS = 400
MAX_NOTES = 12
"""the scratchpad keeps the newest notes"""
MAX_RESULT_CHARS = 2000


def _compact(x: Any) -> str:
    text = json.dumps(x, separators=(",", ":"), default=str)
    return text if len(text) <= MAX_RESULT_CHARS else text[: MAX_RESULT_CHARS - 20] + '..."(truncated)"'


class PlannerTools:
    """The tools of one planner call over ``study``'s current state."""

    def __init__(
        self,
        spec: StudySpec,
        space: Space,
        study: optuna.Study,
        trials: list[optuna.trial.FrozenTrial],
        *,
        tried: Sequence[str] = (),
        ranking: Sequence[Any] = (),
        fallback: Any = None,
        max_tool_calls: int = 8,
        deadline: float | None = None,
        budget: Callable[[], dict[str, Any]] | None = None,
        secrets: Sequence[str | None] = (),
        result_chars: int | None = None,
    ) -> None:
        self.spec, self.space, self.study, self.trials = spec, space, study, trials
        self.tried = set(tried)
        self.ranking = list(ranking)
        self.fallback = fallback
        self.max_tool_calls = max_tool_calls
        self.deadline = deadline
        self._budget = budget
        self._secrets = list(secrets)
        self.result_chars = result_chars
        """what the tool results may add to the prompt (``llm.max_prompt_tokens`` less the rest), in chars"""
        self._spent_chars = 0
        self.calls: list[dict[str, Any]] = []
        self.new_notes: list[str] = []
        self._learned: Any = None
        self._mem_cal = study_memory_calibration(study)

    # --- bookkeeping ------------------------------------------------------------------------------------
    @property
    def used(self) -> int:
        return len(self.calls)

    def _run(self, name: str, args: dict[str, Any], fn: Callable[[], Any]) -> str:
        entry: dict[str, Any] = {"tool": name, "args": args}
        if self.used >= self.max_tool_calls:
            result: Any = {
                "error": f"tool budget spent (llm.max_tool_calls={self.max_tool_calls}): call submit now"
            }
            entry["refused"] = "max_tool_calls"
        elif self.deadline is not None and time.monotonic() > self.deadline:
            result = {"error": "time budget spent (llm.timeout_s): call submit now"}
            entry["refused"] = "timeout"
        elif self.result_chars is not None and self._spent_chars >= self.result_chars:
            result = {"error": "prompt budget spent (llm.max_prompt_tokens): call submit now"}
            entry["refused"] = "max_prompt_tokens"
        else:
            try:
                result = fn()
            except Exception as exc:  # the agent sees the error and may try again
                result = {"error": f"{type(exc).__name__}: {exc}"[:300]}
                entry["error"] = result["error"]
        text = redact(_compact(result), values=self._secrets)
        self._spent_chars += len(text) + len(json.dumps(args, default=str))
        entry["result"] = text
        self.calls.append(entry)
        return text

    def _config(self, config: dict[str, Any] | str) -> TrainingConfig:
        if isinstance(config, str):
            config = json.loads(config)
        if not isinstance(config, dict):
            raise SpecError("config must be an object with the axes " + ", ".join(AXES))
        unknown = sorted(set(config) - set(AXES) - {"rationale"})
        if unknown:
            raise SpecError(f"unknown axes {unknown}; the axes are {', '.join(AXES)}")
        return self.space.make(**{a: config[a] for a in AXES if a in config})

    # --- the tools ------------------------------------------------------------------------------------------
    def check(self, config: dict[str, Any]) -> str:
        """Whether a configuration (axes tp, pp, ep, cp, vpp, mbs, recompute, moe_dispatcher, pp_schedule,
        ep_overlap; missing ones from the baseline) is legal, with every rule it breaks, and whether it was
        tried already."""

        def run() -> dict[str, Any]:
            c = self._config(config)
            canon = self.space.canonical(c)
            reasons = self.space.check(canon)
            outside = [
                f"{a}={getattr(canon, a)}" for a in AXES if getattr(canon, a) not in self.space.candidates[a]
            ]
            out: dict[str, Any] = {"config": canon.key(), "legal": not reasons and not outside}
            if reasons:
                out["reasons"] = reasons
            if outside:
                out["outside_study_axes"] = outside
            fix = repair_near_miss(self.space, canon.to_params()) if not out["legal"] else None
            if fix is not None:
                out["nearest_legal"] = {"config": fix[0], "note": fix[1]}
            out["tried"] = canon.key() in self.tried
            return out

        return self._run("check", {"config": config}, run)

    def estimate(self, config: dict[str, Any]) -> str:
        """Peak memory per pipeline stage vs the usable memory; the step time and every one of its terms
        (compute, recompute, bubble, each communication, optimizer: exposed seconds of the busiest stage, which
        sets the pace); each stage's pipeline work; the model's tokens/s/GPU and the expectation corrected by
        this study's measurements; once trials are measured, each term's measured-vs-estimated factor."""

        def run() -> dict[str, Any]:
            c = self.space.canonical(self._config(config))
            reasons = self.space.check(c)
            if reasons:
                return {"config": c.key(), "legal": False, "reasons": reasons}
            mem = estimate_memory(self.spec, c)
            fits, attrs = memory_attrs(mem, self._mem_cal)
            est = estimate_throughput(self.spec, c)
            out: dict[str, Any] = {
                "config": c.key(),
                "fits": fits,
                "peak_gib_per_stage": [round(s.total_gib, 1) for s in mem.stages],
                "usable_gib": round(mem.usable_gib, 1),
                "step_time_s": round(est.step_time_s, 4),
                "step_terms_s": {t: round(est.breakdown_s.get(t, 0.0), 4) for t in BREAKDOWN_TERMS},
                "model_tokens_per_s_per_gpu": round(est.tokens_per_s_per_gpu, 1),
            }
            if len(est.stage_work_s) > 1:
                out["busiest_stage"] = est.busiest_stage
                out["pipeline_work_s_per_stage"] = [round(w, 3) for w in est.stage_work_s]
            if not fits:
                out["why_not"] = attrs.get("prune_reason")
            expected = self._expected(c)
            if expected is not None:
                out["expected_tokens_per_s_per_gpu"], out["uncertainty"] = expected
            residuals = self._term_residuals(est.breakdown_s)
            if residuals:
                out["measured_vs_estimated"] = residuals
            return out

        return self._run("estimate", {"config": config}, run)

    def history(self, k: int = 10) -> str:
        """The newest ``k`` trials: configuration, state, measured/estimated tokens/s/GPU, or why pruned/failed."""
        k = max(1, min(int(k), 30))
        return self._run(
            "history",
            {"k": k},
            lambda: [_trial_row(t) for t in self.trials if t.user_attrs.get("config_key")][-k:],
        )

    def best(self) -> str:
        """The best completed trial so far (value, configuration, memory) and how many trials ran."""

        def run() -> dict[str, Any]:
            done = [t for t in self.trials if t.state == optuna.trial.TrialState.COMPLETE and t.values]
            if not done:
                return {"best": None, "trials": len(self.trials)}
            b = max(done, key=lambda t: t.values[0])
            return {"best": _trial_row(b), "trials": len(self.trials), "complete": len(done)}

        return self._run("best", {}, run)

    def legal_values(self) -> str:
        """The values each axis may take in this study."""
        return self._run("legal_values", {}, self.space.legal_values)

    def budget(self) -> str:
        """What is left: planner calls, tool calls in this call, seconds in this call, dollars."""

        def run() -> dict[str, Any]:
            out = dict(self._budget() if self._budget else {})
            out["tool_calls_left"] = max(0, self.max_tool_calls - self.used - 1)
            if self.deadline is not None:
                out["seconds_left"] = round(max(0.0, self.deadline - time.monotonic()), 1)
            return out

        return self._run("budget", {}, run)

    def top_untried(self, k: int = 5) -> str:
        """The ``k`` untried configurations the study's corrected model ranks best (expected tokens/s/GPU,
        uncertainty of log throughput: 0.05 is about ±5%)."""
        k = max(1, min(int(k), 12))
        return self._run(
            "top_untried",
            {"k": k},
            lambda: [
                {
                    "config": r.config.to_params(),
                    "expected": round(r.expected, 1),
                    "uncertainty": round(r.uncertainty, 3),
                    "peak_gib": round(r.peak_gib, 1),
                }
                for r in self.ranking[:k]
            ],
        )

    def note(self, text: str) -> str:
        """Keep a short note for later calls (what you learned: an axis that hurts, a rule that bites)."""

        def run() -> dict[str, Any]:
            clean = redact(str(text), values=self._secrets).strip()[:MAX_NOTE_CHARS]
            if not clean:
                raise ValueError("empty note")
            self.new_notes.append(clean)
            return {"kept": True, "notes": len(self.new_notes) + len(llm_budget.notes(self.study))}

        return self._run("note", {"text": str(text)[:MAX_NOTE_CHARS]}, run)

    def notes(self) -> str:
        """The notes kept by earlier calls and this one."""
        return self._run("notes", {}, lambda: [*llm_budget.notes(self.study), *self.new_notes][-MAX_NOTES:])

    def functions(self) -> list[Callable[..., str]]:
        return [
            self.check,
            self.estimate,
            self.history,
            self.best,
            self.legal_values,
            self.budget,
            self.top_untried,
            self.note,
            self.notes,
        ]

    def save_notes(self) -> None:
        """Append this call's notes to the study's scratchpad (the newest :data:`MAX_NOTES`)."""
        if self.new_notes:
            kept = [*llm_budget.notes(self.study), *self.new_notes][-MAX_NOTES:]
            set_study_state(self.study, llm_budget.NOTES, kept)

    # --- the corrected model --------------------------------------------------------------------------------
    def _learn(self) -> Any:
        if self._learned is None:
            self._learned = self.fallback.learn(self.trials, self._mem_cal.scale)
        return self._learned

    def _term_residuals(self, breakdown_s: dict[str, float]) -> dict[str, Any] | None:
        """Per step-time term with time in it: the model's seconds, the seconds the study's measurements say
        (the calibration fitted to them) and their ratio; ``None`` before any trial is measured."""
        if self.fallback is None:
            return None
        cal, _, _, _, obs = self._learn()
        measured = sum(1 for o in obs if not o.prior)
        if not measured or cal.is_identity:
            return None
        terms = {
            t: {
                "estimated_s": round(v, 4),
                "calibrated_s": round(v * cal.factor(t), 4),
                "measured_over_estimated": round(cal.factor(t), 3),
            }
            for t in BREAKDOWN_TERMS
            if (v := breakdown_s.get(t, 0.0)) > 0
        }
        return {"measured_trials": measured, "terms": terms}

    def _expected(self, config: TrainingConfig) -> tuple[float, float] | None:
        if self.fallback is None:
            return None
        _, post, table, prior_log, _ = self._learn()
        i = table.index.get(config)
        if i is None:
            return None
        mean, sd = post.predict()
        return round(math.exp(prior_log[i] + mean[i]), 1), round(float(sd[i]), 3)


def _trial_row(t: optuna.trial.FrozenTrial) -> dict[str, Any]:
    ua = t.user_attrs
    d: dict[str, Any] = {"trial": t.number, "config": ua.get("config_key"), "state": t.state.name.lower()}
    if t.values:
        d["tokens_per_s_per_gpu"] = round(t.values[0], 1)
    if ua.get("estimate_tokens_per_s_per_gpu") is not None:
        d["estimate"] = round(float(ua["estimate_tokens_per_s_per_gpu"]), 1)
    if ua.get("memory_peak_gib") is not None:
        d["peak_gib"] = round(float(ua["memory_peak_gib"]), 1)
    why = ua.get("prune_reason") or ua.get("failure_reason")
    if why:
        d["why"] = str(why)[:160]
    return d
