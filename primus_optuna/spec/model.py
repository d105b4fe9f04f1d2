"""Model architecture (:class:`ModelSpec`), its catalog, and the Hugging Face ``config.json`` importer.

Field names follow Megatron-LM's arguments so a study file reads like a Megatron launch script.
Catalog entries are public architecture facts (shared/reference/models.md).
"""

from __future__ import annotations

import json
import math
import re
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

from pydantic import ConfigDict, Field, field_validator, model_validator

from ..errors import SpecError
from .strict import StrictIntModel

_PATTERN_TERM = re.compile(r"\[\s*([01])\s*\]\s*\*\s*(\d+)")


def parse_layer_pattern(text: str) -> list[int]:
    """Megatron's list expression for ``--moe-layer-freq`` (e.g. ``"([0]*3+[1]*58)"``) as a 0/1 list.

    Only sums of ``[x]*n`` terms and literal 0/1 lists are accepted (never ``eval``)."""
    body = text.strip()
    while body.startswith("(") and body.endswith(")"):
        body = body[1:-1].strip()
    out: list[int] = []
    for term in body.split("+"):
        term = term.strip()
        rep = _PATTERN_TERM.fullmatch(term)
        if rep:
            out += [int(rep.group(1))] * int(rep.group(2))
        elif term.startswith("[") and term.endswith("]"):
            items = [x.strip() for x in term[1:-1].split(",") if x.strip()]
            if any(x not in ("0", "1") for x in items):
                raise ValueError(f"layer pattern {text!r}: {term!r} holds values other than 0/1")
            out += [int(x) for x in items]
        else:
            raise ValueError(
                f"cannot read the layer pattern {text!r} (moe_layer_freq / window_attn_skip_freq); write an "
                "integer, a 0/1 list, or Megatron's '([0]*3+[1]*58)' form"
            )
    return out


@dataclass(frozen=True, slots=True)
class ParameterCounts:
    """Whole-model parameter counts (unsharded). ``total``/``active`` include the input embedding and the
    output layer (once when tied); the multi-token-prediction (MTP) layers are reported apart (``mtp``),
    as DeepSeek-V3's "671B + 14B MTP" is."""

    total: int
    active: int
    """parameters one token passes through: attention, dense MLPs, router, top-k + shared experts"""
    embedding: int
    output: int
    """output layer (0 when tied to the embedding) and final norm"""
    mtp: int = 0
    mtp_active: int = 0

    @property
    def total_with_mtp(self) -> int:
        return self.total + self.mtp


MODEL_HASHED_WHEN_CHANGED = (
    "activation_func_clamp_value",
    "yarn_rotary_scaling_factor",
    "yarn_mscale",
    "yarn_mscale_all_dim",
)
"""model fields that enter the space hash only when they differ from their defaults (study files written
before they existed keep their hash; the workload's: ``spec.study.HASHED_WHEN_CHANGED``)"""


class ModelSpec(StrictIntModel):
    """A decoder-only transformer, dense or MoE, with Megatron-Core's attention and MoE variants.

    Besides GQA (``num_query_groups``) it knows multi-latent attention (MLA: ``multi_latent_attention`` and
    the ``*_lora_rank``/``*_head_dim`` fields), shared experts, dense layers among MoE layers
    (``moe_layer_freq``), multi-token prediction (``mtp_num_layers``) and GPT-OSS-style sliding-window
    attention with attention sinks and linear biases. Field names are Megatron-LM's arguments.

    Example::

        m = ModelSpec.catalog("deepseek-v3")
        m.num_moe_layers, round(m.parameter_counts().total / 1e9)  # (58, 671)
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = "custom"
    num_layers: int = Field(gt=0)
    hidden_size: int = Field(gt=0)
    ffn_hidden_size: int = Field(
        gt=0,
        description="dense MLP width (the dense layers of an MoE model; used when no dense layer exists)",
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
    yarn_rotary_scaling_factor: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="YaRN rotary scaling factor (GPT-OSS: 32); None = plain RoPE. Megatron-Bridge's provider "
        "field, read by Megatron-Core's GPT model; set by the model's recipe, no Megatron-LM flag",
    )
    yarn_mscale: float | None = Field(default=None, allow_inf_nan=False, description="YaRN mscale")
    yarn_mscale_all_dim: float | None = Field(
        default=None, allow_inf_nan=False, description="YaRN mscale_all_dim"
    )
    # --- multi-latent attention (DeepSeek-V2/V3, Kimi-K2, Moonlight); Megatron defaults ---------------------
    multi_latent_attention: bool = False
    q_lora_rank: int | None = Field(
        default=None, gt=0, description="query compression rank; None = no q LoRA"
    )
    kv_lora_rank: int = Field(default=32, gt=0)
    qk_head_dim: int = Field(default=128, gt=0, description="per-head q/k width without RoPE (qk_nope)")
    qk_pos_emb_head_dim: int = Field(default=64, gt=0, description="per-head RoPE width (qk_rope)")
    v_head_dim: int = Field(default=128, gt=0)
    # --- MoE layout -------------------------------------------------------------------------------------------
    moe_shared_expert_intermediate_size: int | None = Field(
        default=None, gt=0, description="total width of the shared experts (n_shared × expert width)"
    )
    moe_shared_expert_gate: bool = Field(
        default=False, description="sigmoid gate on the shared expert (Qwen-MoE)"
    )
    moe_layer_freq: int | list[int] = Field(
        default=1, description="1 = every layer MoE; N = every N-th; or a 0/1 list per layer (0 = dense)"
    )
    moe_router_num_groups: int | None = Field(default=None, gt=0, description="group-limited routing groups")
    moe_router_group_topk: int | None = Field(default=None, gt=0)
    mtp_num_layers: int | None = Field(default=None, ge=1, description="multi-token-prediction depth")
    # --- GPT-OSS attention ------------------------------------------------------------------------------------
    window_size: int | None = Field(default=None, gt=0, description="sliding-window attention width, tokens")
    window_attn_skip_freq: int | list[int] | None = Field(
        default=None,
        description="every N-th layer uses full attention (GPT-OSS: 2), or a 0/1 list per layer with Megatron's "
        "meaning (1 = sliding window, 0 = full); None = every layer windowed when window_size is set",
    )
    softmax_type: Literal["vanilla", "off-by-one", "learnable"] = Field(
        default="vanilla", description="'learnable' = attention sinks (one learned logit per head)"
    )
    add_bias_linear: bool | None = Field(
        default=None,
        description="linear biases; None = Megatron's default for the style (GPT-3 yes, Llama no)",
    )
    activation_func_clamp_value: float | None = Field(
        default=None,
        gt=0,
        allow_inf_nan=False,
        description="GPT-OSS's clamped GLU: its two halves clamped at this value (Megatron-Core "
        "TransformerConfig.activation_func_clamp_value; set by the model's recipe, no Megatron-LM flag)",
    )
    add_qkv_bias: bool = False

    @field_validator("moe_layer_freq", "window_attn_skip_freq", mode="before")
    @classmethod
    def _freq(cls, v: Any) -> Any:
        if isinstance(v, str):
            return int(v) if v.strip().isdigit() else parse_layer_pattern(v)
        return v

    @field_validator("window_size", mode="before")
    @classmethod
    def _window(cls, v: Any) -> Any:
        # Megatron's --window-size is (left, right), also written "(128,0)"; right is 0 for causal training
        if isinstance(v, str) and re.fullmatch(r"\(?\s*\d+\s*,\s*-?\d+\s*\)?", v.strip()):
            return int(v.strip().strip("()").split(",")[0])
        return v[0] if isinstance(v, list | tuple) and v else v

    @model_validator(mode="after")
    def _check(self) -> ModelSpec:
        if self.multi_latent_attention:
            if self.num_query_groups not in (None, self.num_attention_heads):
                raise ValueError(
                    "multi_latent_attention has no KV groups; remove num_query_groups (MLA shares one latent KV)"
                )
        elif self.kv_channels is None and self.hidden_size % self.num_attention_heads:
            raise ValueError(
                "hidden_size must be divisible by num_attention_heads when kv_channels is not given; "
                "set model.kv_channels"
            )
        if self.num_attention_heads % self.query_groups:
            raise ValueError("num_attention_heads must be a multiple of num_query_groups")
        if self.is_moe and self.moe_router_topk > (self.num_experts or 1):
            raise ValueError("moe_router_topk cannot exceed num_experts")
        freq = self.moe_layer_freq
        if isinstance(freq, list):
            if len(freq) != self.num_layers or any(x not in (0, 1) for x in freq):
                raise ValueError(
                    f"moe_layer_freq as a list needs one 0/1 entry per layer ({self.num_layers}); got {len(freq)}"
                )
        elif freq < 1:
            raise ValueError("moe_layer_freq must be ≥ 1 (1 = every layer is MoE)")
        if not self.is_moe and (self.moe_shared_expert_intermediate_size or freq != 1):
            raise ValueError("moe_shared_expert_intermediate_size and moe_layer_freq need num_experts > 1")
        if self.is_moe and self.num_moe_layers == 0:
            raise ValueError("moe_layer_freq leaves no MoE layer; use a dense model (num_experts: null)")
        skip = self.window_attn_skip_freq
        if skip is not None and self.window_size is None:
            raise ValueError("window_attn_skip_freq needs window_size (the sliding-window width)")
        if isinstance(skip, list) and (len(skip) != self.num_layers or any(x not in (0, 1) for x in skip)):
            raise ValueError(
                f"window_attn_skip_freq as a list needs one 0/1 entry per layer ({self.num_layers})"
            )
        if isinstance(skip, int) and skip < 1:
            raise ValueError("window_attn_skip_freq must be ≥ 1")
        return self

    # --- derived ----------------------------------------------------------------------------------------------
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
        """Per-head width of Q and K (MLA: nope + rope part)."""
        if self.multi_latent_attention:
            return self.qk_head_dim + self.qk_pos_emb_head_dim
        return self.kv_channels or self.hidden_size // self.num_attention_heads

    @property
    def expert_ffn(self) -> int:
        """Per-expert FFN width (the dense width when not given)."""
        return self.moe_ffn_hidden_size or self.ffn_hidden_size

    @property
    def shared_expert_ffn(self) -> int:
        return self.moe_shared_expert_intermediate_size or 0

    @property
    def moe_layer_flags(self) -> tuple[bool, ...]:
        """Per layer: True = MoE layer (Megatron ``moe_layer_freq`` semantics); all False for a dense model."""
        if not self.is_moe:
            return (False,) * self.num_layers
        freq = self.moe_layer_freq
        if isinstance(freq, list):
            return tuple(bool(x) for x in freq)
        return tuple(i % freq == 0 for i in range(self.num_layers))

    @property
    def num_moe_layers(self) -> int:
        return sum(self.moe_layer_flags)

    @property
    def num_dense_layers(self) -> int:
        return self.num_layers - self.num_moe_layers

    @property
    def rope_mscale(self) -> float:
        """The factor Megatron's rotary embedding multiplies cos/sin by: YaRN's concentration factor
        (``_yarn_get_concentration_factor``, ``megatron/core/models/common/embeddings/
        yarn_rotary_pos_embedding.py@d98e8a64``:275-293), 1 for plain RoPE."""
        s = self.yarn_rotary_scaling_factor
        if s is None or s <= 1:
            return 1.0

        def get(m: float) -> float:
            return 0.1 * m * math.log(s) + 1.0

        if self.yarn_mscale is None or self.yarn_mscale_all_dim is None:
            return get(1.0)
        return get(self.yarn_mscale) / get(self.yarn_mscale_all_dim)

    @property
    def rope_unfused(self) -> bool:
        """Whether Megatron applies this model's RoPE with its unfused PyTorch code: TE's fused kernel takes no
        mscale other than 1 (``megatron/core/models/common/embeddings/rope_utils.py@d98e8a64``:351-356).
        (MLA's interleaved RoPE falls back too, :350-361; not modelled: its rope part is 64 of a head's 192.)"""
        return (
            self.position_embedding_type == "rope"
            and not self.multi_latent_attention
            and (self.rope_mscale != 1.0)
        )

    @property
    def full_attention_flags(self) -> tuple[bool, ...]:
        """Per layer: True = full causal attention, False = sliding window of ``window_size`` tokens."""
        if self.window_size is None:
            return (True,) * self.num_layers
        skip = self.window_attn_skip_freq
        if skip is None:
            return (False,) * self.num_layers
        if isinstance(skip, list):  # Megatron: 1 = sliding window, 0 = full attention
            return tuple(not x for x in skip)
        return tuple((i + 1) % skip == 0 for i in range(self.num_layers))

    @property
    def cp_comm_type(self) -> Literal["p2p", "a2a"]:
        """How context parallelism runs this model's attention in TransformerEngine: ``a2a`` (heads scattered
        over the CP group, DeepSpeed-Ulysses style) for attention sinks or sliding windows, which TE runs under
        CP only that way (transformer_engine/pytorch/attention/dot_product_attention/utils.py@d0067d0d:
        1146-1155 and 1262-1271; Megatron-Bridge's GPT-OSS recipes set it,
        src/megatron/bridge/recipes/gpt_oss/h100/gpt_oss.py@067f987d:69-70), else Megatron's default ``p2p``
        ring (megatron/training/arguments.py@d98e8a64:3221)."""
        windowed = self.window_size is not None and not all(self.full_attention_flags)
        return "a2a" if self.softmax_type != "vanilla" or windowed else "p2p"

    @property
    def linear_bias(self) -> bool:
        """Linear biases: ``add_bias_linear`` when set, else Megatron's default for GPT-3-style models."""
        if self.add_bias_linear is not None:
            return self.add_bias_linear
        return self.normalization == "LayerNorm" and self.position_embedding_type == "learned_absolute"

    # --- parameters -------------------------------------------------------------------------------------------
    def attention_params(self) -> int:
        """One layer's attention parameters (projections, their biases, MLA's latent norms, sinks)."""
        h, a = self.hidden_size, self.num_attention_heads
        if self.multi_latent_attention:
            qk = self.qk_head_dim + self.qk_pos_emb_head_dim
            if self.q_lora_rank:
                q = h * self.q_lora_rank + self.q_lora_rank + self.q_lora_rank * a * qk
            else:
                q = h * a * qk
            kv = h * (self.kv_lora_rank + self.qk_pos_emb_head_dim) + self.kv_lora_rank
            kv += self.kv_lora_rank * a * (self.qk_head_dim + self.v_head_dim)
            n = q + kv + a * self.v_head_dim * h
            qkv_out = a * qk + self.kv_lora_rank + self.qk_pos_emb_head_dim
        else:
            d, g = self.head_dim, self.query_groups
            qkv_out = (a + 2 * g) * d
            n = h * qkv_out + a * d * h
        if self.linear_bias or self.add_qkv_bias:
            n += qkv_out
        if self.linear_bias:
            n += h
        if self.softmax_type == "learnable":
            n += a
        return n

    def _mlp(self, width: int) -> int:
        h, fc1 = self.hidden_size, 2 if self.swiglu else 1
        return (fc1 + 1) * h * width + ((fc1 * width + h) if self.linear_bias else 0)

    def mlp_params(self, moe: bool) -> tuple[int, int]:
        """(total, active per token) parameters of one layer's MLP block (dense, or router + experts)."""
        if not moe:
            n = self._mlp(self.ffn_hidden_size)
            return n, n
        h, e = self.hidden_size, self.experts
        router = e * h + (e if self.linear_bias else 0)
        shared = self._mlp(self.shared_expert_ffn) if self.shared_expert_ffn else 0
        if shared and self.moe_shared_expert_gate:
            shared += h
        one = self._mlp(self.expert_ffn)
        return router + shared + e * one, router + shared + self.moe_router_topk * one

    def layer_params(self, moe: bool) -> tuple[int, int]:
        """(total, active) parameters of one transformer layer, its two norms included."""
        norms = 2 * self.hidden_size * (2 if self.normalization == "LayerNorm" else 1)
        attn = self.attention_params() + norms
        total, active = self.mlp_params(moe)
        return attn + total, attn + active

    def parameter_counts(self, seq_length: int | None = None) -> ParameterCounts:
        """Total and active-per-token parameters (embeddings and output layer included, MTP apart).

        ``seq_length`` adds learned absolute position embeddings (GPT-3 style) when given."""
        h, norm = self.hidden_size, self.hidden_size * (2 if self.normalization == "LayerNorm" else 1)
        emb = self.vocab_size * h
        if self.position_embedding_type == "learned_absolute" and seq_length:
            emb += seq_length * h
        out = norm + (self.vocab_size * h if self.untie_embeddings_and_output_weights else 0)
        dense, moe = self.layer_params(False), self.layer_params(True)
        n_moe, n_dense = self.num_moe_layers, self.num_dense_layers
        total = emb + out + n_dense * dense[0] + n_moe * moe[0]
        active = emb + out + n_dense * dense[1] + n_moe * moe[1]
        mtp = mtp_active = 0
        if self.mtp_num_layers:
            # Megatron MultiTokenPredictionLayer: enorm + hnorm + eh_proj (2h -> h) + one transformer layer
            # (MoE like the model's last layer) + its final norm; embedding and output layer are shared.
            last = self.layer_params(self.moe_layer_flags[-1])
            extra = 3 * norm + 2 * h * h
            mtp = self.mtp_num_layers * (extra + last[0])
            mtp_active = self.mtp_num_layers * (extra + last[1])
        return ParameterCounts(total, active, emb, out, mtp, mtp_active)

    @classmethod
    def catalog(cls, name: str) -> ModelSpec:
        return MODEL_CATALOG[name]

    @classmethod
    def from_hf_config(cls, path: str | Path, **overrides: Any) -> ModelSpec:
        """Import a Hugging Face ``config.json`` (Llama, Mixtral, Qwen(-MoE), DeepSeek-V2/V3, Kimi-K2,
        Moonlight, GPT-OSS naming); MoE/MLA keys it does not understand are refused, never dropped."""
        p = Path(path)
        if p.is_dir():
            hint = f"; did you mean {str(p / 'config.json')!r}?" if (p / "config.json").is_file() else ""
            raise SpecError(
                f"model.hf_config: {str(p)!r} is a directory; give the path of its config.json{hint}"
            )
        try:
            cfg = json.loads(p.read_text(encoding="utf-8"))
        except FileNotFoundError:
            raise SpecError(
                f"model.hf_config: file {str(p)!r} not found; give a path to a config.json"
            ) from None
        except UnicodeDecodeError as exc:
            raise SpecError(f"model.hf_config: {str(p)!r} is not UTF-8 text ({exc.reason})") from None
        except OSError as exc:
            raise SpecError(f"model.hf_config: cannot read {str(p)!r} ({exc.strerror or exc})") from None
        except json.JSONDecodeError as exc:
            raise SpecError(f"model.hf_config: {str(p)!r} is not valid JSON ({exc})") from None
        if not isinstance(cfg, dict):
            raise SpecError(f"model.hf_config: {str(p)!r} holds no JSON object; give a config.json")
        return cls(**{**hf_to_megatron(cfg, name=p.parent.name or "hf-model"), **overrides})


_HF_ARCH_HINT = re.compile(
    r"expert|moe|lora|rout|nextn|mtp|dense|shared|topk|n_group|rope_head|nope|v_head|sliding|window|"
    r"layer_types|sink|sparse|mlp_only|swiglu_limit"
)
"""Key fragments that mark a config.json key as MoE / MLA / attention-pattern architecture."""

HF_UNDERSTOOD_KEYS: frozenset[str] = frozenset(
    {
        # mapped
        "num_local_experts", "num_experts", "n_routed_experts", "num_experts_per_tok", "experts_per_token",
        "moe_intermediate_size", "n_shared_experts", "shared_expert_intermediate_size", "first_k_dense_replace",
        "moe_layer_freq", "decoder_sparse_step", "mlp_only_layers", "n_group", "topk_group",
        "num_nextn_predict_layers", "q_lora_rank", "kv_lora_rank", "qk_rope_head_dim", "qk_nope_head_dim",
        "v_head_dim", "sliding_window", "use_sliding_window", "max_window_layers", "layer_types", "swiglu_limit",
        # routing options that change neither parameters, FLOPs nor memory
        "norm_topk_prob", "routed_scaling_factor", "topk_method", "scoring_func", "aux_loss_alpha", "seq_aux",
        "router_aux_loss_coef", "output_router_logits", "router_jitter_noise",
    }
)  # fmt: skip
"""Every MoE/MLA/attention-pattern key :func:`hf_to_megatron` maps or knows to be cost-neutral."""


HF_MODEL_TYPES: tuple[str, ...] = (
    "llama", "mistral", "qwen2", "qwen3", "mixtral", "qwen2_moe", "qwen3_moe", "deepseek_v2", "deepseek_v3",
    "kimi_k2", "gpt_oss",
)  # fmt: skip
"""``config.json`` ``model_type`` values :func:`hf_to_megatron` reads (a file without one is read as Llama-like)."""


def _hf_moe_flags(cfg: dict[str, Any], layers: int) -> list[int] | None:
    """Per-layer MoE flags of a Hugging Face MoE config (None = every layer MoE)."""
    first_k = int(cfg.get("first_k_dense_replace") or 0)
    freq = int(cfg.get("moe_layer_freq") or 1)
    step = int(cfg.get("decoder_sparse_step") or 1)
    only = set(cfg.get("mlp_only_layers") or [])
    flags = [
        int(i >= first_k and i % freq == 0 and (i + 1) % step == 0 and i not in only) for i in range(layers)
    ]
    return None if all(flags) else flags


def hf_to_megatron(cfg: dict[str, Any], name: str = "hf-model") -> dict[str, Any]:
    """Map Hugging Face config keys to Megatron-named :class:`ModelSpec` fields.

    Families: Llama/Mistral/Qwen (dense), Mixtral, Qwen-MoE (shared expert, sparse step), DeepSeek-V2/V3,
    Kimi-K2 and Moonlight (MLA, shared experts, first-k dense, MTP), GPT-OSS (sliding windows, sinks,
    biases). Raises :class:`SpecError` naming any MoE/MLA key it does not understand."""
    mtype = str(cfg.get("model_type") or "")
    if mtype and mtype not in HF_MODEL_TYPES:
        raise SpecError(
            f"model.hf_config: model_type {mtype!r} is not supported (supported: {', '.join(HF_MODEL_TYPES)}); "
            "write the model's fields in the study file (model: {...}) if it is a decoder-only transformer"
        )
    missing = [
        k
        for k in (
            "num_hidden_layers",
            "hidden_size",
            "num_attention_heads",
            "vocab_size",
            "intermediate_size",
        )
        if k not in cfg
    ]  # intermediate_size: every supported family writes it; guessing 4 x hidden would be a silent error
    if missing:
        raise SpecError(
            f"model.hf_config: missing keys {missing}; is this a decoder-only transformer config.json?"
        )
    unknown = sorted(k for k in cfg if _HF_ARCH_HINT.search(k) and k not in HF_UNDERSTOOD_KEYS)
    if unknown:
        raise SpecError(
            f"model.hf_config: keys {unknown} describe MoE/attention architecture this importer does not "
            "understand; write the model's fields in the study file (model: {...}) instead of hf_config"
        )
    layers = int(cfg["num_hidden_layers"])
    experts = cfg.get("n_routed_experts") or cfg.get("num_local_experts") or cfg.get("num_experts")
    moe = bool(experts and experts > 1)
    out: dict[str, Any] = {
        "name": cfg.get("_name_or_path") or mtype or name,
        "num_layers": layers,
        "hidden_size": cfg["hidden_size"],
        "ffn_hidden_size": cfg["intermediate_size"],
        "num_attention_heads": cfg["num_attention_heads"],
        "num_query_groups": cfg.get("num_key_value_heads"),
        "kv_channels": cfg.get("head_dim"),
        "vocab_size": cfg["vocab_size"],
        "num_experts": experts if moe else None,
        "untie_embeddings_and_output_weights": not cfg.get("tie_word_embeddings", False),
        "swiglu": cfg.get("hidden_act", "silu") in ("silu", "swiglu"),
    }
    if cfg.get("kv_lora_rank"):
        out.update(
            multi_latent_attention=True,
            q_lora_rank=cfg.get("q_lora_rank"),
            kv_lora_rank=cfg["kv_lora_rank"],
            qk_head_dim=cfg.get("qk_nope_head_dim", 128),
            qk_pos_emb_head_dim=cfg.get("qk_rope_head_dim", 64),
            v_head_dim=cfg.get("v_head_dim", 128),
            num_query_groups=None,
            kv_channels=None,
        )
    if moe:
        fe = cfg.get("moe_intermediate_size") or cfg.get("intermediate_size")
        out["moe_router_topk"] = cfg.get("num_experts_per_tok") or cfg.get("experts_per_token") or 2
        out["moe_ffn_hidden_size"] = fe
        shared = cfg.get("shared_expert_intermediate_size") or (cfg.get("n_shared_experts") or 0) * fe
        if shared:
            out["moe_shared_expert_intermediate_size"] = shared
            out["moe_shared_expert_gate"] = (
                "shared_expert_intermediate_size" in cfg
            )  # Qwen-MoE's sigmoid gate
        flags = _hf_moe_flags(cfg, layers)
        if flags is not None:
            out["moe_layer_freq"] = flags
        if cfg.get("n_group") and cfg["n_group"] > 1:
            out["moe_router_num_groups"] = cfg["n_group"]
            out["moe_router_group_topk"] = cfg.get("topk_group")
    if cfg.get("num_nextn_predict_layers"):
        out["mtp_num_layers"] = cfg["num_nextn_predict_layers"]
    window = cfg.get("sliding_window")
    if window and cfg.get("use_sliding_window", True) is not False:
        out["window_size"] = window
        types = cfg.get("layer_types")
        if types:
            full = [int(t == "full_attention") for t in types]
            period = next(
                (p for p in range(1, layers + 1) if full == [int((i + 1) % p == 0) for i in range(layers)]),
                None,
            )
            # an integer period when the pattern has one, else Megatron's list (1 = sliding window)
            out["window_attn_skip_freq"] = period if period is not None else [1 - f for f in full]
    scaling = cfg.get("rope_scaling") or {}
    if scaling.get("rope_type", scaling.get("type")) == "yarn" and not out.get("multi_latent_attention"):
        out["yarn_rotary_scaling_factor"] = scaling.get("factor")
        out["yarn_mscale"] = scaling.get("mscale")
        out["yarn_mscale_all_dim"] = scaling.get("mscale_all_dim")
    if mtype == "gpt_oss":
        out.update(softmax_type="learnable", add_bias_linear=True)  # attention sinks; biased linears
        out["swiglu"] = True  # clamped SwiGLU
        out["activation_func_clamp_value"] = cfg.get("swiglu_limit", 7.0)  # HF openai/gpt-oss: 7.0
    elif cfg.get("attention_bias") or mtype in ("qwen2", "qwen2_moe"):
        out["add_qkv_bias"] = True
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
    # --- MLA + shared experts + first-k dense (+ MTP) families: the Hugging Face config.json of each model
    # (shared/reference/models.md); moe_shared_expert_intermediate_size = n_shared_experts × moe_intermediate_size.
    # HF deepseek-ai/DeepSeek-V2-Lite config.json: 15.7B total, 2.4B active.
    "deepseek-v2-lite": _m(
        name="deepseek-v2-lite",
        num_layers=27,
        hidden_size=2048,
        ffn_hidden_size=10944,
        num_attention_heads=16,
        vocab_size=102400,
        multi_latent_attention=True,
        q_lora_rank=None,
        kv_lora_rank=512,
        qk_head_dim=128,
        qk_pos_emb_head_dim=64,
        v_head_dim=128,
        num_experts=64,
        moe_router_topk=6,
        moe_ffn_hidden_size=1408,
        moe_shared_expert_intermediate_size=2 * 1408,
        moe_layer_freq=[0] + [1] * 26,
    ),
    # HF deepseek-ai/DeepSeek-V2 config.json (and Primus deepseek_v2.yaml): 236B total, 21B active.
    "deepseek-v2": _m(
        name="deepseek-v2",
        num_layers=60,
        hidden_size=5120,
        ffn_hidden_size=12288,
        num_attention_heads=128,
        vocab_size=102400,
        multi_latent_attention=True,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_head_dim=128,
        qk_pos_emb_head_dim=64,
        v_head_dim=128,
        num_experts=160,
        moe_router_topk=6,
        moe_ffn_hidden_size=1536,
        moe_shared_expert_intermediate_size=2 * 1536,
        moe_layer_freq=[0] + [1] * 59,
        moe_router_num_groups=8,
        moe_router_group_topk=3,
    ),
    # HF deepseek-ai/DeepSeek-V3 config.json: 671B total, 37B active, + 1 MTP layer (~14B with its own copy of
    # embedding and head in the HF checkpoint; shared in Megatron).
    "deepseek-v3": _m(
        name="deepseek-v3",
        num_layers=61,
        hidden_size=7168,
        ffn_hidden_size=18432,
        num_attention_heads=128,
        vocab_size=129280,
        multi_latent_attention=True,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_head_dim=128,
        qk_pos_emb_head_dim=64,
        v_head_dim=128,
        num_experts=256,
        moe_router_topk=8,
        moe_ffn_hidden_size=2048,
        moe_shared_expert_intermediate_size=2048,
        moe_layer_freq=[0] * 3 + [1] * 58,
        moe_router_num_groups=8,
        moe_router_group_topk=4,
        mtp_num_layers=1,
    ),
    # HF moonshotai/Kimi-K2-Base config.json (DeepSeek-V3 schema): 1.04T total, 32.6B active (model card).
    "kimi-k2": _m(
        name="kimi-k2",
        num_layers=61,
        hidden_size=7168,
        ffn_hidden_size=18432,
        num_attention_heads=64,
        vocab_size=163840,
        multi_latent_attention=True,
        q_lora_rank=1536,
        kv_lora_rank=512,
        qk_head_dim=128,
        qk_pos_emb_head_dim=64,
        v_head_dim=128,
        num_experts=384,
        moe_router_topk=8,
        moe_ffn_hidden_size=2048,
        moe_shared_expert_intermediate_size=2048,
        moe_layer_freq=[0] + [1] * 60,
    ),
    # HF moonshotai/Moonlight-16B-A3B config.json (DeepSeek-V3 schema): 16B total, 3B active (model card).
    "moonlight-16b-a3b": _m(
        name="moonlight-16b-a3b",
        num_layers=27,
        hidden_size=2048,
        ffn_hidden_size=11264,
        num_attention_heads=16,
        vocab_size=163840,
        multi_latent_attention=True,
        q_lora_rank=None,
        kv_lora_rank=512,
        qk_head_dim=128,
        qk_pos_emb_head_dim=64,
        v_head_dim=128,
        num_experts=64,
        moe_router_topk=6,
        moe_ffn_hidden_size=1408,
        moe_shared_expert_intermediate_size=2 * 1408,
        moe_layer_freq=[0] + [1] * 26,
    ),
    # --- GPT-OSS: HF openai/gpt-oss-{20b,120b} config.json and model card (116.8B / 5.1B active; 20.9B / 3.6B):
    # alternating 128-token sliding-window and full attention (layer_types), attention sinks, biased linears.
    "gpt-oss-20b": _m(
        name="gpt-oss-20b",
        num_layers=24,
        hidden_size=2880,
        ffn_hidden_size=2880,
        num_attention_heads=64,
        num_query_groups=8,
        kv_channels=64,
        vocab_size=201088,
        num_experts=32,
        moe_router_topk=4,
        moe_ffn_hidden_size=2880,
        window_size=128,
        window_attn_skip_freq=2,
        softmax_type="learnable",
        add_bias_linear=True,
        activation_func_clamp_value=7.0,
        yarn_rotary_scaling_factor=32.0,
    ),
    "gpt-oss-120b": _m(
        name="gpt-oss-120b",
        num_layers=36,
        hidden_size=2880,
        ffn_hidden_size=2880,
        num_attention_heads=64,
        num_query_groups=8,
        kv_channels=64,
        vocab_size=201088,
        num_experts=128,
        moe_router_topk=4,
        moe_ffn_hidden_size=2880,
        window_size=128,
        window_attn_skip_freq=2,
        softmax_type="learnable",
        add_bias_linear=True,
        activation_func_clamp_value=7.0,
        yarn_rotary_scaling_factor=32.0,
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
