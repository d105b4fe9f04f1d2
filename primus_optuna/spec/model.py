"""Model architecture (:class:`ModelSpec`), its catalog, and the Hugging Face ``config.json`` importer.

Field names follow Megatron-LM's arguments so a study file reads like a Megatron launch script.
Catalog entries are public architecture facts (shared/reference/models.md).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

from ..errors import SpecError


class ModelSpec(BaseModel):
    """A decoder-only transformer, dense or MoE.

    Example::

        m = ModelSpec.catalog("mixtral-8x22b")
        m.is_moe, m.head_dim  # (True, 128)
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    ffn_hidden_size: int = Field(
        gt=0, description="dense MLP width (also used when an MoE model has no dense layer)"
    )
    num_attention_heads: int = Field(gt=0)
    num_query_groups: int | None = Field(
        default=None, gt=0, description="KV heads (GQA); None = num_attention_heads"
    )
    kv_channels: int | None = Field(default=None, gt=0, description="head dim; None = hidden_size / heads")
    vocab_size: int = Field(gt=0)
    num_experts: int | None = Field(default=None, ge=1, description="None or 1 = dense")
    moe_router_topk: int = Field(default=2, ge=1)
    moe_ffn_hidden_size: int | None = Field(default=None, gt=0, description="per-expert FFN width")
    swiglu: bool = True
    untie_embeddings_and_output_weights: bool = True
    normalization: Literal["RMSNorm", "LayerNorm"] = "RMSNorm"
    position_embedding_type: Literal["rope", "learned_absolute"] = "rope"

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                "hidden_size must be divisible by num_attention_heads when kv_channels is not given; "
                "set model.kv_channels"
            )
        if self.num_attention_heads % self.query_groups:
            raise ValueError("num_attention_heads must be a multiple of num_query_groups")
        if self.is_moe and self.moe_router_topk > (self.num_experts or 1):
            raise ValueError("moe_router_topk cannot exceed num_experts")
        return self

    @property
    def is_moe(self) -> bool:
        return (self.num_experts or 1) > 1

    @property
    def experts(self) -> int:
        return self.num_experts or 1

    @property
    def query_groups(self) -> int:
        return self.num_query_groups or self.num_attention_heads

    @property
    def head_dim(self) -> int:
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def expert_ffn(self) -> int:
        """Per-expert FFN width (the dense width when not given)."""
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @classmethod
    def catalog(cls, name: str) -> ModelSpec:
        return MODEL_CATALOG[name]

    @classmethod
    def from_hf_config(cls, path: str | Path, **overrides: Any) -> ModelSpec:
        """Import a Hugging Face ``config.json`` (Llama, Mixtral, Qwen-MoE naming)."""
        p = Path(path)
        try:
            cfg = json.loads(p.read_text())
        except FileNotFoundError:
            raise SpecError(
                f"model.hf_config: file {str(p)!r} not found; give a path to a config.json"
            ) from None
        except json.JSONDecodeError as exc:
            raise SpecError(f"model.hf_config: {str(p)!r} is not valid JSON ({exc})") from None
        return cls(**{**hf_to_megatron(cfg, name=p.parent.name or "hf-model"), **overrides})


def hf_to_megatron(cfg: dict[str, Any], name: str = "hf-model") -> dict[str, Any]:
    """Map Hugging Face config keys to Megatron-named :class:`ModelSpec` fields."""
    missing = [
        k for k in ("num_hidden_layers", "hidden_size", "num_attention_heads", "vocab_size") if k not in cfg
    ]
    if missing:
        raise SpecError(
            f"model.hf_config: missing keys {missing}; is this a decoder-only transformer config.json?"
        )
    experts = cfg.get("num_local_experts") or cfg.get("num_experts")
    out: dict[str, Any] = {
        "name": cfg.get("_name_or_path") or cfg.get("model_type") or name,
        "num_layers": cfg["num_hidden_layers"],
        "hidden_size": cfg["hidden_size"],
        "ffn_hidden_size": cfg.get("intermediate_size") or 4 * cfg["hidden_size"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_query_groups": cfg.get("num_key_value_heads"),
        "kv_channels": cfg.get("head_dim"),
        "vocab_size": cfg["vocab_size"],
        "num_experts": experts if experts and experts > 1 else None,
        "untie_embeddings_and_output_weights": not cfg.get("tie_word_embeddings", False),
        "swiglu": cfg.get("hidden_act", "silu") in ("silu", "swiglu"),
    }
    if experts and experts > 1:
        out["moe_router_topk"] = cfg.get("num_experts_per_tok", 2)
        out["moe_ffn_hidden_size"] = cfg.get("moe_intermediate_size") or cfg.get("intermediate_size")
    return {k: v for k, v in out.items() if v is not None}


def _m(**kw: Any) -> ModelSpec:
    return ModelSpec(**kw)


# Public architecture facts (shared/reference/models.md).
MODEL_CATALOG: dict[str, ModelSpec] = {
    "mixtral-8x7b": _m(
        name="mixtral-8x7b",
        num_layers=32,
        hidden_size=4096,
        ffn_hidden_size=14336,
        num_attention_heads=32,
        num_query_groups=8,
        kv_channels=128,
        vocab_size=32000,
        num_experts=8,
        moe_router_topk=2,
        moe_ffn_hidden_size=14336,
    ),
    "mixtral-8x22b": _m(
        name="mixtral-8x22b",
        num_layers=56,
        hidden_size=6144,
        ffn_hidden_size=16384,
        num_attention_heads=48,
        num_query_groups=8,
        kv_channels=128,
        vocab_size=32000,
        num_experts=8,
        moe_router_topk=2,
        moe_ffn_hidden_size=16384,
    ),
    "llama3.1-8b": _m(
        name="llama3.1-8b",
        num_layers=32,
        hidden_size=4096,
        ffn_hidden_size=14336,
        num_attention_heads=32,
        num_query_groups=8,
        kv_channels=128,
        vocab_size=128256,
    ),
    "llama3.1-70b": _m(
        name="llama3.1-70b",
        num_layers=80,
        hidden_size=8192,
        ffn_hidden_size=28672,
        num_attention_heads=64,
        num_query_groups=8,
        kv_channels=128,
        vocab_size=128256,
    ),
    "llama3.1-405b": _m(
        name="llama3.1-405b",
        num_layers=126,
        hidden_size=16384,
        ffn_hidden_size=53248,
        num_attention_heads=128,
        num_query_groups=8,
        kv_channels=128,
        vocab_size=128256,
    ),
    "qwen3-30b-a3b": _m(
        name="qwen3-30b-a3b",
        num_layers=48,
        hidden_size=2048,
        ffn_hidden_size=6144,
        num_attention_heads=32,
        num_query_groups=4,
        kv_channels=128,
        vocab_size=151936,
        num_experts=128,
        moe_router_topk=8,
        moe_ffn_hidden_size=768,
    ),
    "qwen3-235b-a22b": _m(
        name="qwen3-235b-a22b",
        num_layers=94,
        hidden_size=4096,
        ffn_hidden_size=12288,
        num_attention_heads=64,
        num_query_groups=4,
        kv_channels=128,
        vocab_size=151936,
        num_experts=128,
        moe_router_topk=8,
        moe_ffn_hidden_size=1536,
    ),
    # GPT-3-style dense model of Korthikanti et al. 2022 / Narayanan et al. 2021 (validation.md): GeLU MLP
    # with ffn = 4h, LayerNorm, learned positions, vocab 51200, tied embeddings.
    "gpt3-175b": _m(
        name="gpt3-175b",
        num_layers=96,
        hidden_size=12288,
        ffn_hidden_size=4 * 12288,
        num_attention_heads=96,
        vocab_size=51200,
        swiglu=False,
        untie_embeddings_and_output_weights=False,
        normalization="LayerNorm",
        position_embedding_type="learned_absolute",
    ),
}
