"""What the planner's answer must look like, near-miss repair, and what counts as a reason.

- :func:`candidate_schema`: the JSON schema of one candidate whose axis fields are enums of the study's legal
  values (so a constrained decoder cannot emit ``tp: 3``), plus a short ``rationale``.
- :func:`response_format`: that schema as the provider's structured-output request: OpenAI's
  ``json_schema`` (also vLLM, llama.cpp's ``llama-server``, Ollama), or llama-cpp-python's
  ``json_object`` + ``schema``.
- :func:`repair_near_miss`: an illegal candidate one axis away from a legal one (``1f1b`` with ``vpp>1``) is
  repaired the way the sweep repairs (:func:`~primus_optuna.search.sweep.repair`); the repair is said in
  the candidate's rationale.
- :func:`no_reason`: a rationale that only repeats the prompt (:func:`prompt_text`) or itself, or holds no
  words, is not kept as a reason.
"""

from __future__ import annotations

import json
import re
from typing import Any

from pydantic import BaseModel

from ..errors import SpecError
from ..space import Space, TrainingConfig
from ..spec.axes import unused_optional
from ..spec.study import AXES
from .sweep import repair

RATIONALE_CHARS = 300
"""a rationale longer than this is cut (a small model's run-on answer must not fill the report)"""
REASON_CHARS = 160
"""what the answer schema allows a candidate's reason (short: the candidates come first, so a small model's
answer tokens go to them)"""
REASONING_CHARS = 400
"""what the answer schema allows the closing reasoning"""
_CONTROL = re.compile(r"\x1b\[[0-9;?]*[A-Za-z]|[\x00-\x08\x0b-\x1f\x7f]")


def sanitise(text: Any, limit: int = RATIONALE_CHARS) -> str:
    """Model text made safe to print and store: no control characters or terminal escapes, whitespace
    collapsed, cut at ``limit`` characters (``…`` marks the cut)."""
    clean = " ".join(_CONTROL.sub(" ", str(text or "")).split())
    return clean if len(clean) <= limit else clean[: limit - 1].rstrip() + "…"


def candidate_schema(space: Space) -> dict[str, Any]:
    """One candidate: every axis an enum of its legal values, ``rationale`` a short string."""
    legal = space.legal_values()
    props: dict[str, Any] = {}
    axes = [a for a in AXES if not unused_optional(a, legal[a])]
    for axis in axes:
        values = legal[axis]
        kind = (
            "boolean"
            if all(isinstance(v, bool) for v in values)
            else "integer"
            if all(isinstance(v, int) for v in values)
            else "string"
        )
        props[axis] = {"type": kind, "enum": list(values)}
    props["rationale"] = {"type": "string", "maxLength": REASON_CHARS}
    return {
        "type": "object",
        "properties": props,
        "required": [*axes, "rationale"],
        "additionalProperties": False,
    }


def answer_schema(space: Space, n: int, *, reasoning: bool = True) -> dict[str, Any]:
    """The one-shot answer: ``{"candidates": [candidate, ...], "reasoning": ...}`` with at most ``n``
    candidates first (each with a short reason), then a bounded reasoning: an answer cut at ``llm.max_tokens``
    still holds its candidates."""
    props: dict[str, Any] = {
        "candidates": {
            "type": "array",
            "items": candidate_schema(space),
            "minItems": 1,
            "maxItems": max(1, n),
        }
    }
    if reasoning:
        props["reasoning"] = {"type": "string", "maxLength": REASONING_CHARS}
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def rank_schema(k: int, n: int) -> dict[str, Any]:
    """The rank-mode answer: ``{"choices": [{"pick": 1..k, "rationale": ...}], "reasoning": ...}``, at most
    ``n`` choices, each a number on the shortlist of ``k``."""
    choice = {
        "type": "object",
        "properties": {
            "pick": {"type": "integer", "enum": list(range(1, max(1, k) + 1))},
            "rationale": {"type": "string", "maxLength": REASON_CHARS},
        },
        "required": ["pick", "rationale"],
        "additionalProperties": False,
    }
    props = {
        "choices": {"type": "array", "items": choice, "minItems": 1, "maxItems": max(1, min(n, k))},
        "reasoning": {"type": "string", "maxLength": REASONING_CHARS},
    }
    return {"type": "object", "properties": props, "required": list(props), "additionalProperties": False}


def response_format(schema: dict[str, Any], kind: str) -> dict[str, Any] | None:
    """The request's ``response_format`` for ``kind`` (``json_schema``, ``json_object`` or ``none``)."""
    if kind == "json_schema":
        return {"type": "json_schema", "json_schema": {"name": "planner_answer", "schema": schema}}
    if kind == "json_object":  # llama-cpp-python's server: JSON mode constrained by a schema
        return {"type": "json_object", "schema": schema}
    return None


def repair_near_miss(space: Space, params: dict[str, Any]) -> tuple[dict[str, Any], str] | None:
    """The legal configuration one axis away from an illegal candidate, and a note saying what moved
    (``None`` when the candidate is legal, malformed, or needs more than one axis changed)."""
    try:
        config = TrainingConfig.from_params({a: params[a] for a in AXES if a in params})
        c0 = space.canonical(config)
    except (SpecError, TypeError, ValueError):
        return None
    if not space.check(c0) and all(getattr(c0, a) in space.candidates[a] for a in AXES):
        return None
    for axis in REPAIRABLE:
        fixed_c = repair(space, config, fixed=tuple(a for a in AXES if a != axis))
        if fixed_c is None:
            continue
        moved = [a for a in AXES if getattr(fixed_c, a) != getattr(c0, a)]
        if moved == [axis]:
            note = f"repaired: {axis} {getattr(c0, axis)}→{getattr(fixed_c, axis)} to stay legal"
            return fixed_c.to_params(), note
    return None


REPAIRABLE = ("pp_schedule", "recompute", "ep_overlap", "moe_dispatcher", "vpp")
"""the axes a near miss most often gets wrong (``1f1b`` with ``vpp>1``, ``full:N`` past a chunk's layers), in
the order a repair tries them: the schedule follows the virtual stages asked for rather than the reverse"""


ECHO_RUN = 5
"""words per run compared by :func:`no_reason`"""
ECHO_SHARE = 0.8
"""a rationale whose runs of :data:`ECHO_RUN` words are at least this share copied from the prompt is an echo"""
DISTINCT_SHARE = 0.6
"""a rationale whose runs of :data:`ECHO_RUN` words are less than this share distinct repeats itself"""


def prompt_text(value: Any) -> str:
    """The words of a prompt's fields (nested lists and dicts flattened)."""
    if isinstance(value, dict):
        return " ".join(prompt_text(v) for v in value.values())
    if isinstance(value, list | tuple):
        return " ".join(prompt_text(v) for v in value)
    if isinstance(value, type) and issubclass(value, BaseModel):  # a response_format class
        return json.dumps(value.model_json_schema())
    return "" if value is None else str(value)


def no_reason(text: str, prompt: str) -> str | None:
    """Why a rationale is not a reason, or ``None``: at least :data:`ECHO_SHARE` of its runs of :data:`ECHO_RUN`
    words appear in the prompt (a small model copying its input), or fewer than :data:`DISTINCT_SHARE` of them
    are distinct (a model looping on a phrase), or it holds fewer than two words of letters (digits, brackets), or
    nothing at all."""
    if not text.strip():
        return "(no reason given)"
    if len(re.findall(r"[^\W\d_]{3,}", text)) < 2:
        return "(no reason given: the answer held no words)"
    words = re.findall(r"\w+", text.lower())
    if len(words) < ECHO_RUN:
        return None
    hay = " " + " ".join(re.findall(r"\w+", prompt.lower())) + " "
    runs = [" " + " ".join(words[i : i + ECHO_RUN]) + " " for i in range(len(words) - ECHO_RUN + 1)]
    if sum(r in hay for r in runs) >= ECHO_SHARE * len(runs):
        return "(no reason given: the answer repeated the prompt)"
    if len(words) >= 2 * ECHO_RUN and len(set(runs)) < DISTINCT_SHARE * len(runs):
        return "(no reason given: the answer repeated itself)"
    return None
