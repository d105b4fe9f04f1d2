"""Pipeline layouts: which decoder layers, MTP layers, embedding and loss each pipeline chunk holds.

A study's ``pipeline`` section speaks Megatron-Core's forms:

- ``layout``: ``--pipeline-model-parallel-layout``, e.g. ``"Et*3|(tt|)*29m|L"``: ``E`` embedding, ``t`` a
  decoder layer, ``m`` an MTP layer, ``L`` the loss (output layer), ``|`` separates the pp·vpp chunks in model
  order (chunk ``c`` lives on stage ``c mod pp``), ``x*n`` and ``(…)*n`` repeat;
- ``decoder_first_pipeline_num_layers`` / ``decoder_last_pipeline_num_layers``: layers of the first/last
  pipeline rank, the rest split evenly (each rank's share then split over its vpp chunks);
- ``account_for_embedding_in_pipeline_split`` / ``account_for_loss_in_pipeline_split``: the embedding / loss
  count as one layer each in the even split.

Without any of these the layers split evenly (Megatron: PP divides the layers). MTP layers (``mtp_num_layers``)
sit in the last chunk unless the layout places them.

Example::

    chunks = pipeline_chunks(ModelSpec.catalog("deepseek-v3"), PipelineSpec(layout="Et*3|(tt|)*29m|L"), 8, 4)
    len(chunks), chunks[0].decoder  # (32, 3)
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from pydantic import ConfigDict, Field, field_validator

from .strict import StrictIntModel

if TYPE_CHECKING:
    from .model import ModelSpec

_TOKENS = frozenset("EtmL")


def expand_layout(text: str) -> list[str]:
    """Expand a Megatron layout string into one token string per chunk (``"Et*2|tL"`` -> ``["Ett", "tL"]``)."""
    s = re.sub(r"[\s,]", "", text)
    pos = 0

    def group() -> str:
        nonlocal pos
        out = []
        while pos < len(s) and s[pos] != ")":
            ch = s[pos]
            if ch == "(":
                pos += 1
                inner = group()
                if pos >= len(s) or s[pos] != ")":
                    raise ValueError(f"pipeline.layout {text!r}: unbalanced '('")
                pos += 1
                item = inner
            elif ch in _TOKENS or ch == "|":
                pos += 1
                item = ch
            else:
                raise ValueError(
                    f"pipeline.layout {text!r}: unexpected {ch!r}; use E, t, m, L, |, (…) and *n (Megatron's "
                    "--pipeline-model-parallel-layout)"
                )
            rep = re.match(r"\*(\d+)", s[pos:])
            if rep:
                pos += rep.end()
                item *= int(rep.group(1))
            out.append(item)
        return "".join(out)

    flat = group()
    if pos != len(s):
        raise ValueError(f"pipeline.layout {text!r}: unbalanced ')'")
    return flat.split("|")


@dataclass(frozen=True, slots=True)
class Chunk:
    """One model chunk (a virtual pipeline stage) in model order."""

    decoder: int
    """decoder layers"""
    moe: int
    """of which MoE layers"""
    mtp: int = 0
    embedding: bool = False
    loss: bool = False

    @property
    def dense(self) -> int:
        return self.decoder - self.moe


class PipelineSpec(StrictIntModel):
    """``pipeline``: how layers are placed on pipeline stages (Megatron-Core argument names)."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    layout: str | None = Field(
        default=None, description="Megatron --pipeline-model-parallel-layout, e.g. 'Et*3|(tt|)*29m|L'"
    )
    decoder_first_pipeline_num_layers: int | None = Field(default=None, ge=0)
    decoder_last_pipeline_num_layers: int | None = Field(default=None, ge=0)
    account_for_embedding_in_pipeline_split: bool = False
    account_for_loss_in_pipeline_split: bool = False

    @field_validator("layout")
    @classmethod
    def _layout(cls, v: str | None) -> str | None:
        if v is None:
            return v
        chunks = expand_layout(v)
        flat = "".join(chunks)
        if flat.count("E") != 1 or "E" not in chunks[0]:
            raise ValueError(f"pipeline.layout {v!r}: the embedding E must appear once, in the first chunk")
        if flat.count("L") != 1 or "L" not in chunks[-1]:
            raise ValueError(f"pipeline.layout {v!r}: the loss L must appear once, in the last chunk")
        return v

    @property
    def is_default(self) -> bool:
        return self == PipelineSpec()

    def check_model(self, model: ModelSpec) -> None:
        """Raise ValueError when the layout does not place exactly the model's layers."""
        if self.layout is None:
            if self.decoder_first_pipeline_num_layers is not None or self.decoder_last_pipeline_num_layers:
                first = self.decoder_first_pipeline_num_layers or 0
                last = self.decoder_last_pipeline_num_layers or 0
                if first + last > model.num_layers:
                    raise ValueError(
                        f"pipeline: decoder_first/last_pipeline_num_layers ({first}+{last}) exceed the model's "
                        f"{model.num_layers} layers"
                    )
            return
        flat = "".join(expand_layout(self.layout))
        if flat.count("t") != model.num_layers:
            raise ValueError(
                f"pipeline.layout places {flat.count('t')} decoder layers (t) but the model has {model.num_layers}"
            )
        if flat.count("m") != (model.mtp_num_layers or 0):
            raise ValueError(
                f"pipeline.layout places {flat.count('m')} MTP layers (m) but model.mtp_num_layers is "
                f"{model.mtp_num_layers or 0}"
            )
        if (
            self.decoder_first_pipeline_num_layers is not None
            or self.decoder_last_pipeline_num_layers is not None
        ):
            raise ValueError(
                "pipeline: give either layout or decoder_first/last_pipeline_num_layers, not both"
            )

    @property
    def layout_chunks(self) -> int | None:
        """Chunks (pp·vpp) a layout string fixes; None without a layout."""
        return len(expand_layout(self.layout)) if self.layout else None


def _split_reason(
    model: ModelSpec, p: PipelineSpec, pp: int, vpp: int
) -> tuple[list[int] | None, str | None]:
    """Decoder layers per chunk (model order) of the even / first-last / account-for split, or a reason."""
    n, chunks = model.num_layers, pp * vpp
    first, last = p.decoder_first_pipeline_num_layers, p.decoder_last_pipeline_num_layers
    if pp == 1:
        return ([n] if vpp == 1 else None), (None if vpp == 1 else "pp=1 cannot have virtual stages")
    if first is not None or last is not None:
        rest, stages = n - (first or 0) - (last or 0), pp - (first is not None) - (last is not None)
        if stages > 0 and rest % stages:
            return None, (
                f"pp={pp}: the {rest} layers between the first/last stages do not divide over {stages} stages"
            )
        mid = rest // stages if stages > 0 else 0
        per_stage = [mid] * pp
        if first is not None:
            per_stage[0] = first
        if last is not None:
            per_stage[-1] = last
        if stages <= 0 and sum(per_stage) != n:
            return None, f"pp={pp}: decoder_first/last_pipeline_num_layers do not add up to {n} layers"
        bad = [c for c in per_stage if c % vpp]
        if bad:
            return None, f"vpp={vpp} does not divide a stage's {bad[0]} layers (first/last-stage split)"
        return [per_stage[c % pp] // vpp for c in range(chunks)], None
    extra_e = int(p.account_for_embedding_in_pipeline_split)
    extra_l = int(p.account_for_loss_in_pipeline_split)
    total = n + extra_e + extra_l
    if total % pp:
        what = "layers" + (" + embedding" if extra_e else "") + (" + loss" if extra_l else "")
        fix = (
            "use a pp that divides them"
            if extra_e and extra_l
            else "use a pp that divides them, count the embedding/loss as layers "
            "(pipeline.account_for_embedding_in_pipeline_split / account_for_loss_in_pipeline_split), or place "
            "the layers with pipeline.layout"
        )
        return None, f"pp={pp} does not divide the {total} {what}; {fix}"
    if total % chunks:
        return None, f"vpp={vpp} needs the {total} layers divisible by pp·vpp={chunks}"
    per = [total // chunks] * chunks
    per[0] -= extra_e
    per[-1] -= extra_l
    if min(per) < 0:
        return None, f"pp·vpp={chunks} leaves a chunk with no room for the embedding/loss"
    return per, None


def pipeline_chunks(model: ModelSpec, pipeline: PipelineSpec, pp: int, vpp: int) -> tuple[Chunk, ...]:
    """The chunks (model order, pp·vpp of them) of ``model`` under ``pipeline``; ValueError when illegal."""
    chunks, reason = chunks_or_reason(model, pipeline, pp, vpp)
    if chunks is None:
        raise ValueError(reason)
    return chunks


def chunks_or_reason(
    model: ModelSpec, pipeline: PipelineSpec, pp: int, vpp: int
) -> tuple[tuple[Chunk, ...] | None, str | None]:
    """Like :func:`pipeline_chunks` but returns ``(None, reason)`` instead of raising."""
    flags = model.moe_layer_flags
    mtp = model.mtp_num_layers or 0
    if pipeline.layout and pp > 1:
        tokens = expand_layout(pipeline.layout)
        if len(tokens) != pp * vpp:
            return None, (
                f"pipeline.layout has {len(tokens)} chunks; pp·vpp={pp}·{vpp}={pp * vpp} must equal it"
            )
        out, i = [], 0
        for tok in tokens:
            t = tok.count("t")
            out.append(Chunk(t, sum(flags[i : i + t]), tok.count("m"), "E" in tok, "L" in tok))
            i += t
        return tuple(out), None
    per, reason = _split_reason(model, pipeline, pp, vpp)
    if per is None:
        return None, reason
    out, i = [], 0
    for c, t in enumerate(per):
        end = c == len(per) - 1
        out.append(Chunk(t, sum(flags[i : i + t]), mtp if end else 0, c == 0, end))
        i += t
    return tuple(out), None


def stage_reason(model: ModelSpec, pipeline: PipelineSpec, pp: int) -> str | None:
    """Why ``pp`` cannot split the model's layers at all (before vpp is known), or None."""
    if pp == 1:
        return None
    if pipeline.layout:
        n = pipeline.layout_chunks or 1
        return None if n % pp == 0 else f"pp={pp} does not divide the {n} chunks of pipeline.layout"
    _, reason = _split_reason(model, pipeline, pp, 1)
    if reason and reason.startswith("vpp"):
        return None
    return reason


def layout_string(chunks: tuple[Chunk, ...]) -> str:
    """Megatron's layout string of ``chunks`` (the inverse of :func:`expand_layout`, runs compressed)."""
    parts = []
    for ch in chunks:
        s = ("E" if ch.embedding else "") + (f"t*{ch.decoder}" if ch.decoder > 1 else "t" * ch.decoder)
        s += "m" * ch.mtp + ("L" if ch.loss else "")
        parts.append(s)
    return "|".join(parts)
