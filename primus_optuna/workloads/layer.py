"""A compact Megatron-like transformer layer in torch, at one GPU's slice of a configuration.

Built from a :class:`~primus_optuna.physics.shapes.LayerShape` (heads and FFN widths already divided by tp,
sequence by cp, experts by ep), it keeps for backward what Megatron-Core keeps, so that the bytes torch saves
(``torch.autograd.graph.saved_tensors_hooks``) can be checked against
:func:`~primus_optuna.physics.shapes.layer_activation_bytes`:

- norms keep their input and fp32 statistics (like TE / Apex fused norms), not an fp32 copy of the input;
- sequence parallelism: the column-parallel GEMMs see the sequence all-gathered over tp (simulated by
  repeating the local chunk tp times) but keep only the local chunk and re-gather in backward; the
  row-parallel GEMMs end with a reduce-scatter (simulated by summing the tp chunks), which keeps nothing;
- attention is ``torch.nn.functional.scaled_dot_product_attention`` (flash kernel: keeps Q, K, V, the output
  and the log-sum-exp); GQA via ``enable_gqa``;
- SwiGLU keeps only its input (Megatron's fused ``SwiGLUFunction``); dropout keeps a 1-byte mask;
- MoE: fp32 softmax router, top-k, permutation of the token copies to the local experts (a token routed to
  expert e is computed by local expert ``e mod local_experts``, which reproduces the per-rank token count
  of balanced expert parallelism), per-expert SwiGLU/GeLU MLPs with the routing probabilities applied inside the activation (Megatron-Core
  ≥ 0.13) and an un-permutation without probabilities;
- recompute: the ``core_attn`` module (``selective``) wraps core attention, ``full``/``full:N`` the whole
  layer, in a reentrant ``torch.utils.checkpoint`` (Megatron's own checkpoint is reentrant: it saves the
  inputs only); the other selective modules are not implemented by this layer (they run without recompute).

No communication happens; the layer is what one rank computes, for profiling and for a small local
training workload (stack :func:`build_layer` outputs).
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F
from torch import nn
from torch.utils.checkpoint import checkpoint

from ..physics.shapes import LayerShape
from ..spec.recompute import parse_recompute

__all__ = ["LayerShape", "TransformerLayer", "build_layer", "count_saved_bytes", "make_input"]


class _Norm(torch.autograd.Function):
    """RMSNorm/LayerNorm computed in fp32; keeps the (bf16) input and fp32 statistics only."""

    @staticmethod
    def forward(
        ctx: Any, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None, eps: float
    ) -> Any:
        xf = x.float()
        if bias is None:
            rstd = torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)
            y = xf * rstd * weight.float()
            ctx.save_for_backward(x, weight, rstd)
        else:
            mean = xf.mean(-1, keepdim=True)
            rstd = torch.rsqrt((xf - mean).pow(2).mean(-1, keepdim=True) + eps)
            y = (xf - mean) * rstd * weight.float() + bias.float()
            ctx.save_for_backward(x, weight, rstd, mean, bias)
        ctx.eps = eps
        return y.to(x.dtype)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        saved = ctx.saved_tensors
        x, weight = saved[0], saved[1]
        bias = saved[4] if len(saved) > 4 else None
        with torch.enable_grad():
            xd = x.detach().requires_grad_(True)
            wd = weight.detach().requires_grad_(True)
            bd = bias.detach().requires_grad_(True) if bias is not None else None
            if bd is None:
                y = F.rms_norm(xd.float(), (x.shape[-1],), wd.float(), ctx.eps)
                inputs = (xd, wd)
            else:
                y = F.layer_norm(xd.float(), (x.shape[-1],), wd.float(), bd.float(), ctx.eps)
                inputs = (xd, wd, bd)
            grads = torch.autograd.grad(y.to(x.dtype), inputs, grad)
        return grads[0], grads[1], (grads[2] if bd is not None else None), None


class _GatherLinear(torch.autograd.Function):
    """Column-parallel GEMM under sequence parallelism: all-gather (simulated), keep the local chunk only."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, weight: torch.Tensor, tp: int) -> torch.Tensor:
        ctx.tp = tp
        ctx.save_for_backward(x, weight)
        full = x.repeat(tp, *([1] * (x.dim() - 1))) if tp > 1 else x
        return F.linear(full, weight)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        x, weight = ctx.saved_tensors
        tp = ctx.tp
        full = x.repeat(tp, *([1] * (x.dim() - 1))) if tp > 1 else x
        grad_w = grad.reshape(-1, grad.shape[-1]).t() @ full.reshape(-1, full.shape[-1])
        grad_full = grad @ weight
        grad_x = grad_full.view(tp, *x.shape).sum(0) if tp > 1 else grad_full  # reduce-scatter
        return grad_x, grad_w, None


class _SwiGLU(torch.autograd.Function):
    """silu(gate) · up, keeping only the input (Megatron ``SwiGLUFunction``)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor) -> torch.Tensor:
        ctx.save_for_backward(x)
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> torch.Tensor:
        (x,) = ctx.saved_tensors
        with torch.enable_grad():
            xd = x.detach().requires_grad_(True)
            gate, up = xd.chunk(2, dim=-1)
            (g,) = torch.autograd.grad(F.silu(gate) * up, xd, grad)
        return g


class _Dropout(torch.autograd.Function):
    """Dropout keeping a 1-byte mask (as the fused CUDA kernels do)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, p: float) -> torch.Tensor:
        mask = torch.rand_like(x, dtype=torch.float32) >= p
        ctx.scale = 1.0 / (1.0 - p)
        ctx.save_for_backward(mask)
        return x * mask * ctx.scale

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        (mask,) = ctx.saved_tensors
        return grad * mask * ctx.scale, None


class _WeightedAct(torch.autograd.Function):
    """act(x) · routing probability, keeping only the input and the probabilities (Megatron-Core ≥ 0.13
    ``weighted_bias_swiglu_impl``: the probabilities are applied inside the fused activation)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, w: torch.Tensor, swiglu: bool) -> torch.Tensor:
        ctx.save_for_backward(x, w)
        ctx.swiglu = swiglu
        return _act(x, swiglu) * w[:, None]

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        x, w = ctx.saved_tensors
        with torch.enable_grad():
            xd, wd = x.detach().requires_grad_(True), w.detach().requires_grad_(True)
            gx, gw = torch.autograd.grad(_act(xd, ctx.swiglu) * wd[:, None], (xd, wd), grad)
        return gx, gw, None


def _act(x: torch.Tensor, swiglu: bool) -> torch.Tensor:
    if swiglu:
        gate, up = x.chunk(2, dim=-1)
        return F.silu(gate) * up
    return F.gelu(x)


class _Unpermute(torch.autograd.Function):
    """Scatter of the (already probability-weighted) expert outputs back to their tokens; keeps only the
    token ids (Megatron's ``unpermute`` without probs)."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, ids: torch.Tensor, n_tokens: int) -> torch.Tensor:
        ctx.save_for_backward(ids)
        out = torch.zeros(n_tokens, x.shape[-1], dtype=x.dtype, device=x.device)
        return out.index_add_(0, ids, x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        (ids,) = ctx.saved_tensors
        return grad.index_select(0, ids), None, None


def _reduce_scatter(y: torch.Tensor, tp: int) -> torch.Tensor:
    """Row-parallel output: sum of the tp partial sums, each rank keeping its sequence chunk (simulated)."""
    return y.view(tp, y.shape[0] // tp, *y.shape[1:]).sum(0) if tp > 1 else y


def _mlp_act(x: torch.Tensor, swiglu: bool) -> torch.Tensor:
    return _SwiGLU.apply(x) if swiglu else F.gelu(x)


class TransformerLayer(nn.Module):
    """Pre-norm decoder layer (attention + dense MLP or MoE) at one rank's shape. Input ``[seq/tp, mbs, h]``."""

    def __init__(self, shape: LayerShape, recompute: str = "none", eps: float = 1e-5) -> None:
        super().__init__()
        s = self.shape = shape
        self.recompute = recompute
        self._rc = parse_recompute(recompute)
        self.eps = eps
        h, d = s.hidden, s.head_dim
        qkv_out = (s.heads + 2 * s.groups) * d
        fc1_mult = 2 if s.swiglu else 1

        def w(*size: int) -> nn.Parameter:
            return nn.Parameter(torch.randn(*size) * (1.0 / size[-1] ** 0.5))

        self.norm1_w = nn.Parameter(torch.ones(h))
        self.norm2_w = nn.Parameter(torch.ones(h))
        self.norm1_b = nn.Parameter(torch.zeros(h)) if s.layernorm else None
        self.norm2_b = nn.Parameter(torch.zeros(h)) if s.layernorm else None
        self.qkv_w = w(qkv_out, h)
        self.proj_w = w(h, s.heads * d)
        self.qkv_b = nn.Parameter(torch.zeros(qkv_out)) if s.bias else None
        self.proj_b = nn.Parameter(torch.zeros(h)) if s.bias else None
        if s.moe:
            self.router_w = w(s.experts, h)
            self.w1 = w(s.local_experts, fc1_mult * s.expert_ffn, h)
            self.w2 = w(s.local_experts, h, s.expert_ffn)
        else:
            self.fc1_w = w(fc1_mult * s.ffn, h)
            self.fc2_w = w(h, s.ffn)
            self.fc1_b = nn.Parameter(torch.zeros(fc1_mult * s.ffn)) if s.bias else None
            self.fc2_b = nn.Parameter(torch.zeros(h)) if s.bias else None

    # --- pieces -----------------------------------------------------------------------------------------------
    def _norm(self, x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
        return _Norm.apply(x, weight, bias, self.eps)

    def _dropout(self, x: torch.Tensor) -> torch.Tensor:
        return _Dropout.apply(x, self.shape.dropout) if self.shape.dropout > 0 and self.training else x

    def _core_attention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        return F.scaled_dot_product_attention(
            q, k, v, is_causal=True, enable_gqa=self.shape.groups != self.shape.heads
        )

    def _attention(self, x: torch.Tensor) -> torch.Tensor:
        s = self.shape
        y = self._norm(x, self.norm1_w, self.norm1_b)
        qkv = _GatherLinear.apply(y, self.qkv_w, s.tp)  # [seq, b, (a + 2g) d]
        if self.qkv_b is not None:
            qkv = qkv + self.qkv_b
        seq, b = qkv.shape[0], qkv.shape[1]
        d = s.head_dim
        q, k, v = qkv.split([s.heads * d, s.groups * d, s.groups * d], dim=-1)
        q = q.view(seq, b, s.heads, d).permute(1, 2, 0, 3)
        k = k.view(seq, b, s.groups, d).permute(1, 2, 0, 3)
        v = v.view(seq, b, s.groups, d).permute(1, 2, 0, 3)
        if self._rc.has("core_attn"):
            o = checkpoint(self._core_attention, q, k, v, use_reentrant=True)
        else:
            o = self._core_attention(q, k, v)
        o = o.permute(2, 0, 1, 3).reshape(seq, b, s.heads * d)
        out = _reduce_scatter(F.linear(o, self.proj_w), s.tp)
        if self.proj_b is not None:
            out = out + self.proj_b
        return x + self._dropout(out)

    def _dense_mlp(self, y: torch.Tensor) -> torch.Tensor:
        s = self.shape
        z = _GatherLinear.apply(y, self.fc1_w, s.tp)
        if self.fc1_b is not None:
            z = z + self.fc1_b
        out = _reduce_scatter(F.linear(_mlp_act(z, s.swiglu), self.fc2_w), s.tp)
        return out + self.fc2_b if self.fc2_b is not None else out

    def _moe(self, y: torch.Tensor) -> torch.Tensor:
        s = self.shape
        tokens = y.reshape(-1, s.hidden)  # [Tl, h] (sequence-parallel tokens are routed locally, ETP = 1)
        probs = torch.softmax(F.linear(tokens, self.router_w).float(), dim=-1)
        top_p, top_e = torch.topk(probs, s.topk, dim=-1)  # [Tl, k]
        local = (top_e % s.local_experts).flatten()
        order = torch.argsort(local, stable=True)
        token_ids = torch.div(order, s.topk, rounding_mode="floor")
        x = tokens.index_select(0, token_ids)  # permuted token copies [Tl·k, h]
        counts = torch.bincount(local, minlength=s.local_experts).tolist()
        weights = top_p.flatten()[order].to(x.dtype)
        outs, start = [], 0
        for j, n in enumerate(counts):
            xj, wj = x[start : start + n], weights[start : start + n]
            outs.append(F.linear(_WeightedAct.apply(F.linear(xj, self.w1[j]), wj, s.swiglu), self.w2[j]))
            start += n
        expert_out = torch.cat(outs)
        combined = _Unpermute.apply(expert_out, token_ids, tokens.shape[0])
        return combined.view_as(y)

    def _mlp(self, x: torch.Tensor) -> torch.Tensor:
        y = self._norm(x, self.norm2_w, self.norm2_b)
        out = self._moe(y) if self.shape.moe else self._dense_mlp(y)
        return x + self._dropout(out)

    def _layer(self, x: torch.Tensor) -> torch.Tensor:
        return self._mlp(self._attention(x))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self._rc.is_full:
            return checkpoint(self._layer, x, use_reentrant=True)
        return self._layer(x)


def build_layer(
    shape: LayerShape,
    recompute: str = "none",
    dtype: torch.dtype = torch.bfloat16,
    device: str | torch.device = "cpu",
) -> TransformerLayer:
    """The layer of ``shape`` with parameters in ``dtype`` on ``device``."""
    return TransformerLayer(shape, recompute).to(device=device, dtype=dtype)


def make_input(
    shape: LayerShape, dtype: torch.dtype = torch.bfloat16, device: str | torch.device = "cpu"
) -> torch.Tensor:
    """A random layer input ``[seq/tp, mbs, hidden]`` that requires grad (as a pipeline stage input does)."""
    x = torch.randn(shape.seq // shape.tp, shape.mbs, shape.hidden, dtype=dtype, device=device)
    return x.requires_grad_(True)


def count_saved_bytes(layer: nn.Module, x: torch.Tensor) -> tuple[int, torch.Tensor]:
    """Bytes the forward pass of ``layer`` saves for backward, counted once per storage and excluding the
    parameters; returns (bytes, output)."""
    param_ptrs = {p.untyped_storage().data_ptr() for p in layer.parameters()}
    seen: dict[int, int] = {}

    def pack(t: torch.Tensor) -> torch.Tensor:
        st = t.untyped_storage()
        ptr = st.data_ptr()
        if ptr not in param_ptrs:
            seen[ptr] = st.nbytes()
        return t

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda t: t):
        out = layer(x)
    return sum(seen.values()), out
