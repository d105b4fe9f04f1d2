"""The per-tensor account checked against Megatron-Core itself: one transformer layer, dense and MoE, built
from Megatron-Core's local (non-TransformerEngine) spec on a CPU (gloo, world size 1; see ``cpu_shims``), and
the unique storages its autograd graph saves (``torch.autograd.graph.saved_tensors_hooks``, bytes counted
after the forward so storages that Megatron frees, as ``moe_act``/``layernorm`` recompute do, count 0), for
no recompute and each selective module. The expectation is the model's own per-tensor terms
(:func:`~primus_optuna.physics.layer_activation_terms`, written for the TE spec) with the local spec's known
differences swapped in, each stated below; the removals per module are the model's
:data:`~primus_optuna.physics.RECOMPUTE_DROPS` wherever the two specs agree. Exact to the byte.

Local spec vs TE spec (what the swaps model):

- norms: torch RMSNorm keeps an fp32 copy of its input, the fp32 normalised tensor and the fp32 rstd
  (8·Tl·h + 4·Tl) where TE keeps the bf16 input and rstd (2·Tl·h + 4·Tl); and the input norm is its own
  module, so ``layernorm`` recompute also checkpoints it (each norm then keeps only its bf16 input and both
  norm outputs are freed), where in the TE spec it is fused into the QKV GEMM and untouched;
- attention: unfused ``DotProductAttention`` keeps Q and K, V expanded to all heads (3·T·a·d·b), the bool
  mask (mbs·s²), the fp32 softmax (4·mbs·a·s²) and the bf16 probabilities (2·mbs·a·s²), where flash keeps
  Q, K, V at their own widths and the fp32 log-sum-exp; ``core_attn`` drops softmax and probabilities and
  its checkpoint keeps the whole QKV GEMM output (which Q, K and V view; with more than one KV group Q is a
  reshaped copy) and a 4-byte int argument;
- MoE routing: the unfused router and permutation keep top-k indices and the sort order (int64, 16·K), top-k
  scores (fp32, 4·K), the permuted probabilities (bf16, 2·K), the routing map (bool) and probabilities
  (bf16) over experts (3·Tl·E) and the tokens per expert (int64), where the TE spec's fused kernels keep
  the account's ~16·Tl·E + 12·K.
"""

from __future__ import annotations

import os

import pytest

from primus_optuna.physics import RECOMPUTE_DROPS, LayerShape, layer_activation_terms

megatron = pytest.importorskip(
    "megatron.core", reason="megatron-core is not installed (pip install -e .[dev])"
)
torch = pytest.importorskip("torch")

pytestmark = pytest.mark.megatron

H, HEADS, GROUPS, FFN, SEQ, MBS = 64, 4, 1, 96, 32, 2
EXPERTS, TOPK, EXPERT_FFN = 8, 2, 48
MODULES = {
    False: [(), ("core_attn",), ("layernorm",), ("mlp",)],
    True: [
        (),
        ("core_attn",),
        ("moe_act",),
        ("layernorm",),
        ("moe_act", "layernorm"),
        ("moe",),
        ("moe", "layernorm"),
    ],
}


@pytest.fixture(scope="module")
def megatron_cpu():
    import warnings

    warnings.filterwarnings("ignore", module="megatron")
    import torch.distributed as dist

    from tests.mcore import cpu_shims

    cpu_shims.install()
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29531")
    if not dist.is_initialized():
        dist.init_process_group("gloo", rank=0, world_size=1)
    from megatron.core import parallel_state

    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(1, 1)
    yield
    parallel_state.destroy_model_parallel()
    dist.destroy_process_group()


def saved_bytes(moe: bool, modules: tuple[str, ...]) -> int:
    """Unique storages (not parameters) the layer's autograd graph holds after one forward."""
    import torch.nn.functional as F
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer.spec_utils import build_module
    from megatron.core.transformer.transformer_config import TransformerConfig

    kw = dict(
        num_layers=1, hidden_size=H, num_attention_heads=HEADS, num_query_groups=GROUPS, ffn_hidden_size=FFN,
        gated_linear_unit=True, activation_func=F.silu, normalization="RMSNorm", add_bias_linear=False,
        hidden_dropout=0.0, attention_dropout=0.0, bf16=True, params_dtype=torch.bfloat16,
        use_cpu_initialization=True, bias_activation_fusion=True, apply_rope_fusion=False,
        masked_softmax_fusion=False, bias_dropout_fusion=False,
    )  # fmt: skip
    if moe:
        kw.update(
            num_moe_experts=EXPERTS, moe_router_topk=TOPK, moe_ffn_hidden_size=EXPERT_FFN,
            moe_token_dispatcher_type="alltoall", moe_grouped_gemm=True, moe_use_legacy_grouped_gemm=True,
            moe_aux_loss_coeff=0.0, moe_router_load_balancing_type="none",
        )  # fmt: skip
    if modules:
        kw.update(recompute_granularity="selective", recompute_modules=list(modules))
    config = TransformerConfig(**kw)
    spec = get_gpt_layer_local_spec(
        num_experts=EXPERTS if moe else None, moe_grouped_gemm=moe, moe_use_legacy_grouped_gemm=moe,
        normalization="RMSNorm",
    )  # fmt: skip
    torch.manual_seed(0)
    layer = build_module(spec, config=config, layer_number=1).to(torch.bfloat16)
    x = torch.randn(SEQ, MBS, H, dtype=torch.bfloat16, requires_grad=True)
    mask = torch.ones(MBS, 1, SEQ, SEQ, dtype=torch.bool).triu(1)
    seen: dict[int, object] = {}

    def pack(t):
        # keyed by the storage object, not its address: a storage Megatron frees (resized to 0) keeps its
        # address while a later tensor may be allocated there
        storage = t.untyped_storage()
        seen.setdefault(storage._cdata, storage)
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x, attention_mask=mask)
    out = out[0] if isinstance(out, tuple) else out
    params = {p.untyped_storage()._cdata for p in layer.parameters()}
    total = sum(s.nbytes() for ptr, s in seen.items() if ptr not in params)
    out.float().sum().backward()  # the graph is whole: backward runs through every checkpoint
    assert x.grad is not None and torch.isfinite(x.grad.float()).all()
    return total


def local_spec_bytes(moe: bool, modules: tuple[str, ...]) -> int:
    """The model's terms for the same layer, with the local spec's differences (module docstring)."""
    shape = LayerShape(
        hidden=H, heads=HEADS, groups=GROUPS, head_dim=H // HEADS, ffn=FFN, seq=SEQ, mbs=MBS, moe=moe,
        experts=EXPERTS if moe else 1, local_experts=EXPERTS if moe else 1, topk=TOPK if moe else 1,
        expert_ffn=EXPERT_FFN if moe else 0,
    )  # fmt: skip
    t = layer_activation_terms(shape)
    T = Tl = SEQ * MBS
    a, d, b = HEADS, H // HEADS, 2
    norm_local = 8 * Tl * H + 4 * Tl
    t.update(norm1_input=norm_local, norm2_input=norm_local, qkv=3 * T * a * d * b)
    del t["softmax_lse"]
    t["attn_mask"] = MBS * SEQ * SEQ
    t["attn_softmax"] = 6 * MBS * a * SEQ * SEQ
    if moe:
        k = Tl * TOPK
        t.update(router_state=3 * Tl * EXPERTS + 8 * EXPERTS, routing_indices=22 * k)
    for module in modules:
        if module == "core_attn":  # the checkpoint keeps the QKV GEMM output (Q, K, V view it), an int32
            del t["attn_softmax"]
            q_copy = T * a * d * b if GROUPS > 1 else 0  # Q is reshaped out of the group-interleaved layout
            t["qkv"] = T * (a + 2 * GROUPS) * d * b + q_copy + 4
        elif module == "layernorm":  # both norms checkpointed, outputs freed
            t.update(norm1_input=2 * Tl * H, norm2_input=2 * Tl * H)
            t.pop("qkv_input")
            t.pop("router_input" if moe else "mlp_input", None)
        else:
            for name in RECOMPUTE_DROPS[module]:
                t.pop(name, None)
    return sum(t.values())


@pytest.mark.parametrize("moe", [False, True], ids=["dense", "moe"])
def test_saved_bytes_equal_the_account(megatron_cpu, moe: bool) -> None:
    measured = {m: saved_bytes(moe, m) for m in MODULES[moe]}
    for modules, got in measured.items():
        assert got == local_spec_bytes(moe, modules), (modules, got)
    none = measured[()]
    # what each module saves, measured, is what the model removes
    if moe:
        assert none - measured[("moe_act",)] == 2 * SEQ * MBS * TOPK * EXPERT_FFN  # fc2 input K·F·b
        assert measured[("moe",)] < measured[("moe_act",)] < none
    else:
        assert none - measured[("mlp",)] == 2 * SEQ * MBS * 3 * FFN  # SwiGLU input + fc2 input
