"""What the planner tells the model: the DSPy signatures of its three modes (one-shot, rank, agent) and the
inputs each is given, read from the study's trials and cut to ``llm.max_prompt_tokens``
(:class:`PromptBuilder`)."""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

import dspy
import optuna
from pydantic import BaseModel, Field, create_model

from ..space import Space
from ..space.rules import RULES
from ..spec import StudySpec
from ..spec.axes import AXIS_LIST
from . import llm_budget
from .llm_client import PlannerAdapter

MAX_TRIED_LISTED = 80
N_BEST = 8
MIN_BEST_KEPT = 2
"""top trials and corrected-ranking entries a one-shot prompt keeps before it leaves out the legal values and
the sweep's effects"""
N_FAILED = 6
RANK_CHOICES = 1
"""choices launched per rank-mode call: the next call sees its measurement (a batch chosen at once would not
adapt, and the fallback's own pick adapts after every trial)"""
CHARS_PER_TOKEN = 3.5
"""prompt-size estimate without a tokenizer (JSON-heavy text; fitted by eye to Llama/Gemma tokenizers). A smaller
vocabulary takes more tokens: SmolLM2's (49 K) counted 3.0 (rank) to 3.3-3.4 (one-shot) characters per token on
the planner's own requests (llama-server's ``prompt_tokens``, 24 requests, 2026-12-07), so its prompts run up to
7% (one-shot) and 16% (rank) over this estimate"""
AGENT_INSTRUCTION_TOKENS = 620
"""ReActV2's instructions and field headers around the inputs (measured on the small MoE study's first
request: 3.7 K chars of messages for 1.5 K chars of inputs)"""


Candidate = create_model(  # one field per axis (spec.axes), then the rationale
    "Candidate",
    __module__=__name__,
    __doc__="One proposed configuration (values are checked in code, so unknown strings parse and are rejected).",
    **{a.name: (a.python_type, ...) if a.planner_required else (a.python_type, a.default) for a in AXIS_LIST},
    rationale=(
        str,
        Field(default="", description="one short sentence: why this should beat the best so far"),
    ),
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
    corrected_ranking: str = dspy.InputField(
        desc="untried configurations ranked by the step-time model corrected by every measurement so far: "
        "expected tokens/s/GPU and the uncertainty of log throughput (0.05 = about ±5%)"
    )
    tried: str = dspy.InputField(desc="configuration keys already tried or queued: do not repeat them")
    rejected_before: str = dspy.InputField(
        desc="your earlier candidates that were not launched, and why (e.g. expected far below the best)"
    )
    n_candidates: int = dspy.InputField(desc="how many candidates to return")
    candidates: list[Candidate] = dspy.OutputField(
        desc="new configurations, best first, each with a short reason"
    )
    reasoning: str = dspy.OutputField(desc="after the candidates: at most two sentences on the evidence used")


class Choice(BaseModel):
    """One choice of the rank mode: a number on the shortlist and why."""

    pick: int
    rationale: str = Field(default="", description="one short sentence: why measure this one next")


class RankCandidates(dspy.Signature):
    """You tune the distributed layout of a Megatron-Core LLM pre-training job to maximise training
    throughput (tokens per second per GPU). A one-axis-at-a-time sweep has been measured, and a step-time
    model corrected by every measurement has shortlisted the untried configurations most worth measuring next.
    Choose which of them to measure next, best first, by their number on the shortlist, each with a short
    reason grounded in the evidence (the sweep's effects, the best trials, what the model may be missing)."""

    study: str = dspy.InputField(desc="model, cluster and workload")
    sweep_effects: str = dspy.InputField(desc="one-axis sweep: per axis, value -> tokens/s/GPU or why pruned")
    best_trials: str = dspy.InputField(desc="best trials so far (estimate, measurement, memory) and failures")
    shortlist: str = dspy.InputField(
        desc="numbered untried configurations: expected tokens/s/GPU, its uncertainty, model estimate, memory"
    )
    rejected_before: str = dspy.InputField(desc="your earlier candidates that were not launched, and why")
    n_choices: int = dspy.InputField(desc="how many to choose")
    choices: list[Choice] = dspy.OutputField(desc="shortlist numbers, best first, each with a short reason")
    reasoning: str = dspy.OutputField(desc="after the choices: at most two sentences on the evidence used")


class PlanWithTools(dspy.Signature):
    """You tune the distributed layout of a Megatron-Core LLM pre-training job to maximise training
    throughput (tokens per second per GPU). A one-axis-at-a-time sweep around a baseline has been measured.
    Use the tools: check an idea's legality, estimate its memory and speed, read the best trials and the
    model-guided ranking, and keep notes for later calls. Then submit new full configurations likely to beat
    the best so far, best first, each legal, fitting in memory, untried, with a one-sentence rationale."""

    study: str = dspy.InputField(desc="model, cluster and workload")
    coupling_rules: str = dspy.InputField(desc="rules every configuration must satisfy")
    situation: str = dspy.InputField(desc="best so far, how many trials ran, notes from earlier calls")
    n_candidates: int = dspy.InputField(desc="how many candidates to return")
    candidates: list[Candidate] = dspy.OutputField(desc="new configurations, best first")


def as_json(x: Any) -> str:
    """One prompt field's JSON, on one line."""
    return json.dumps(x, separators=(", ", ": "), default=str)


def tokens(text: str) -> int:
    """Estimated tokens of ``text`` (:data:`CHARS_PER_TOKEN`)."""
    return int(len(text) / CHARS_PER_TOKEN) + 1


class PromptBuilder:
    """The inputs of each mode's request for one study; ``budget``: the tokens a prompt may take."""

    def __init__(self, spec: StudySpec, space: Space, usable_gib: float | None, budget: int) -> None:
        self.spec, self.space, self.usable_gib, self.budget = spec, space, usable_gib, budget

    def describe_study(self) -> str:
        spec, m, g = self.spec, self.spec.model, self.spec.cluster.gpu
        moe = (
            f", MoE {m.experts} experts top-{m.moe_router_topk} (expert FFN {m.expert_ffn})"
            if m.is_moe
            else ""
        )
        if m.is_moe and (m.shared_expert_ffn or m.num_dense_layers):
            moe += f", {m.shared_expert_ffn} shared-expert width, {m.num_dense_layers} dense layers"
        if m.multi_latent_attention:
            moe += f", MLA (q_lora {m.q_lora_rank}, kv_lora {m.kv_lora_rank})"
        if m.mtp_num_layers:
            moe += f", {m.mtp_num_layers} MTP layer(s)"
        if spec.pipeline.layout:
            moe += f"; pipeline layout {spec.pipeline.layout} ({spec.pipeline.layout_chunks} chunks = pp·vpp)"
        mem = f"; usable memory per GPU ≈ {self.usable_gib:.1f} GiB" if self.usable_gib else ""
        return (
            f"model {m.name}: {m.num_layers} layers, hidden {m.hidden_size}, FFN {m.ffn_hidden_size}, "
            f"{m.num_attention_heads} heads / {m.query_groups} KV groups, vocab {m.vocab_size}{moe}. "
            f"cluster: {spec.cluster.nodes} nodes x {spec.cluster.gpus_per_node} {g.name} "
            f"({g.hbm_gib:.1f} GiB device memory, {g.bf16_tflops} bf16 TFLOPS, {g.fp8_tflops} fp8 TFLOPS, "
            f"topology {g.topology}). "
            f"workload: seq {spec.workload.seq_length}, global batch {spec.workload.global_batch_size}, "
            f"{spec.workload.precision}, distributed optimizer {spec.workload.distributed_optimizer}{mem}."
        )

    @staticmethod
    def rules_text() -> str:
        return "\n".join(f"- {r.text}" for r in RULES) + (
            "\n- world = tp·cp·pp·dp; micro-batches = global_batch / (mbs·dp)"
        )

    def inputs(
        self,
        trials: list[optuna.trial.FrozenTrial],
        n: int,
        tried: list[str],
        ranking: Sequence[Any] = (),
        *,
        k_best: int = N_BEST,
        feedback: Sequence[str] = (),
    ) -> dict[str, Any]:
        """The one-shot prompt's fields (``k_best`` trials and as many ranked/tried configurations)."""
        k_rank = len(ranking) if k_best >= N_BEST else min(len(ranking), k_best)
        return {
            "study": self.describe_study(),
            "legal_values": as_json(
                {a: v for a, v in self.space.legal_values().items() if a in self.space.searched_axes}
            ),
            "coupling_rules": self.rules_text(),
            "sweep_effects": as_json(sweep_effects(trials)),
            "best_trials": as_json(best_trials(trials, self.spec.search.multi_objective, k=k_best)),
            "corrected_ranking": as_json(
                [
                    {
                        "config": r.config.key(),
                        "expected": round(r.expected, 1),
                        "uncertainty": round(r.uncertainty, 3),
                        "model": round(r.estimate, 1),
                        "peak_gib": round(r.peak_gib, 1),
                    }
                    for r in list(ranking)[:k_rank]
                ]
            )
            or "[]",
            "tried": ", ".join(tried[-(MAX_TRIED_LISTED if k_best >= N_BEST else 10 * max(k_best, 1)) :])
            or "(none)",
            "rejected_before": "\n".join(f"- {f}" for f in feedback) or "(none)",
            "n_candidates": n,
        }

    def prompt_tokens(self, adapter: PlannerAdapter, signature: Any, inputs: dict[str, Any]) -> int:
        """Estimated prompt tokens of one request (messages, plus the answer schema / tool list sent with it)."""
        messages = adapter.format(signature, [], inputs)
        extra = json.dumps(adapter.fmt) if adapter.fmt else ""
        return tokens(json.dumps(messages) + extra)

    def compact(
        self,
        adapter: PlannerAdapter,
        trials: list[optuna.trial.FrozenTrial],
        n: int,
        tried: list[str],
        ranking: Sequence[Any],
        feedback: Sequence[str] = (),
    ) -> tuple[dict[str, Any], int, list[str]]:
        """The one-shot inputs cut to ``llm.max_prompt_tokens``: fewer top trials (and ranked/tried
        configurations) down to :data:`MIN_BEST_KEPT`, then no legal values (the answer schema still lists
        them), then no sweep effects, then fewer top trials still (the corrected ranking goes last: it is what
        the candidates are best chosen from)."""
        budget = self.budget
        sig = ProposeConfigs
        dropped: list[str] = []
        left_out: dict[str, str] = {}
        k = N_BEST
        inputs = self.inputs(trials, n, tried, ranking, k_best=k, feedback=feedback)
        size = self.prompt_tokens(adapter, sig, inputs)

        def cut(floor: int) -> None:
            nonlocal k, inputs, size
            while size > budget and k > floor:
                k = max(k // 2, floor)
                inputs = self.inputs(trials, n, tried, ranking, k_best=k, feedback=feedback) | left_out
                size = self.prompt_tokens(adapter, sig, inputs)
                dropped.append(f"top trials cut to {k}")

        cut(MIN_BEST_KEPT)
        note = "(left out to fit llm.max_prompt_tokens)"
        for name in ("legal_values", "sweep_effects"):
            if size <= budget:
                break
            left_out[name] = note + (
                " the answer's schema lists the legal values" if name == "legal_values" else ""
            )
            inputs[name] = left_out[name]
            size = self.prompt_tokens(adapter, sig, inputs)
            dropped.append(f"{name} dropped")
        cut(0)
        return inputs, size, dropped

    def agent_prompt_tokens(self, inputs: dict[str, Any], tool_specs: Sequence[dict[str, Any]]) -> int:
        """Estimated tokens of the agent's fixed prompt: its inputs, the tools' specs and ReActV2's own text."""
        return tokens(json.dumps(inputs) + json.dumps(list(tool_specs))) + AGENT_INSTRUCTION_TOKENS

    def chars_left(self, prompt_est: int) -> int:
        """Characters the budget leaves after a prompt of ``prompt_est`` tokens (the agent's tool results)."""
        return int(max(0, self.budget - prompt_est) * CHARS_PER_TOKEN)

    def agent_inputs(
        self, study: optuna.Study, trials: list[optuna.trial.FrozenTrial], n: int
    ) -> dict[str, Any]:
        """The agent's prompt fields: the study, the rules, the situation (its tools read the rest)."""
        return {
            "study": self.describe_study(),
            "coupling_rules": self.rules_text(),
            "situation": self.situation(study, trials),
            "n_candidates": n,
        }

    def situation(self, study: optuna.Study, trials: list[optuna.trial.FrozenTrial]) -> str:
        """Best so far, how many trials ran, the model's notes and its rejected candidates."""
        done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and t.values]
        parts = [f"{len(trials)} trials so far ({len(done)} complete)."]
        if done:
            b = max(done, key=lambda t: t.values[0])
            parts.append(
                f"best: trial {b.number} {b.user_attrs.get('config_key')} at {b.values[0]:.1f} tokens/s/GPU."
            )
        notes = llm_budget.notes(study)
        if notes:
            parts.append("your notes from earlier calls: " + " | ".join(notes))
        rejected = llm_budget.feedback(study)
        if rejected:
            parts.append("your earlier candidates not launched, and why: " + " | ".join(rejected))
        return " ".join(parts)

    def rank_inputs(
        self,
        trials: list[optuna.trial.FrozenTrial],
        n: int,
        shortlist: Sequence[tuple[Any, Any]],
        feedback: Sequence[str] = (),
    ) -> dict[str, Any]:
        """The rank mode's prompt fields: the study, the sweep's effects, the best trials, the numbered
        shortlist."""
        lines = [
            f"{i}. {r.config.key()}: expected {w.expected:,.0f} tokens/s/GPU (±{w.uncertainty:.0%}; "
            f"{w.share:.0%} of the best), model {r.estimate:,.0f}, peak {r.peak_gib:.1f} GiB"
            for i, (r, w) in enumerate(shortlist, 1)
        ]
        return {
            "study": self.describe_study(),
            "sweep_effects": as_json(sweep_effects(trials)),
            "best_trials": as_json(best_trials(trials, self.spec.search.multi_objective, k=4)),
            "shortlist": "\n".join(lines),
            "rejected_before": "\n".join(f"- {f}" for f in feedback) or "(none)",
            "n_choices": min(n, len(shortlist), RANK_CHOICES),
        }


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


def best_trials(trials: list[optuna.trial.FrozenTrial], multi: bool, k: int = N_BEST) -> dict[str, Any]:
    done = [t for t in trials if t.state == optuna.trial.TrialState.COMPLETE and t.values]
    done.sort(key=lambda t: -t.values[0])
    bad = [
        t
        for t in trials
        if t.state in (optuna.trial.TrialState.FAIL, optuna.trial.TrialState.PRUNED)
        and not str(t.user_attrs.get("prune_reason", "")).startswith("duplicate")
    ]
    return {
        "best": [_summary(t) for t in done[:k]],
        "pruned_or_failed": [_summary(t) for t in bad[-min(N_FAILED, k) :]] if k else [],
        "objective": "maximise tokens/s/GPU" + (" and minimise peak memory (Pareto)" if multi else ""),
    }
