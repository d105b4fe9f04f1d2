"""Run Megatron-Core 0.16 transformer layers on a CPU (gloo, world size 1, no TransformerEngine, no CUDA).

Megatron-Core is written for CUDA; its local (non-TE) layer spec runs on a CPU once these CUDA-only calls are
stood in for. None of them touches what a layer saves for backward:

- ``torch.cuda.Stream``/``stream``/``current_stream``/``current_device`` and the event the all-to-all token
  dispatcher syncs on (device-to-host copy stream): no-ops, ``current_device`` = ``"cpu"`` (the global
  memory buffer of unfused attention allocates there);
- the CUDA RNG tracker and the checkpoint functions' CUDA RNG state save/restore: the CPU generator;
- ``grouped_gemm`` (the CUDA kernel package behind the legacy ``GroupedMLP``): a torch function with the same
  autograd contract (it saves its two inputs and the split sizes), so ``moe_act`` recompute (grouped GEMM
  only) can be measured;
- TransformerEngine names that 0.16.1 leaves undefined when TE is absent (``te_general_gemm``,
  ``FP8GlobalStateManager``, ``activation_recompute_forward``, ``fp8_autocast``): ``None`` / FP8 off.
"""

from __future__ import annotations

import contextlib
import sys
import types
from typing import Any

import torch


class _Event:
    def synchronize(self) -> None:
        pass


class _Stream:
    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, *args: Any) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def record_event(self, *args: Any, **kwargs: Any) -> _Event:
        return _Event()


class _GroupedGemm(torch.autograd.Function):
    """``grouped_gemm.ops.gmm`` on CPU; keeps (a, b, batch_sizes) as the CUDA kernel's autograd does."""

    @staticmethod
    def forward(
        ctx: Any, a: torch.Tensor, b: torch.Tensor, sizes: torch.Tensor, trans_b: bool
    ) -> torch.Tensor:
        ctx.save_for_backward(a, b, sizes)
        ctx.trans_b = trans_b
        outs, start = [], 0
        for i, n in enumerate(sizes.tolist()):
            outs.append(a[start : start + n] @ (b[i].t() if trans_b else b[i]))
            start += n
        return torch.cat(outs)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> Any:
        a, b, sizes = ctx.saved_tensors
        grad_a, grad_b, start = [], torch.zeros_like(b), 0
        for i, n in enumerate(sizes.tolist()):
            w = b[i].t() if ctx.trans_b else b[i]
            grad_a.append(grad[start : start + n] @ w.t())
            gw = a[start : start + n].t() @ grad[start : start + n]
            grad_b[i] = gw.t() if ctx.trans_b else gw
            start += n
        return torch.cat(grad_a), grad_b, None, None


def install() -> None:
    """Install the stand-ins (idempotent); call before building any Megatron module."""
    torch.cuda.Stream = _Stream  # type: ignore[misc,assignment]
    torch.cuda.stream = lambda *a, **k: contextlib.nullcontext()  # type: ignore[assignment]
    torch.cuda.current_stream = lambda *a, **k: _Stream()  # type: ignore[assignment]
    torch.cuda.current_device = lambda: "cpu"  # type: ignore[assignment,return-value]
    torch.cuda.get_rng_state = lambda device="cuda": torch.get_rng_state()  # type: ignore[assignment]
    torch.cuda.random.get_rng_state = torch.cuda.get_rng_state  # type: ignore[assignment]
    torch.cuda.set_rng_state = lambda *a, **k: None  # type: ignore[assignment]

    gg = types.ModuleType("grouped_gemm")
    gmm = lambda a, b, sizes, trans_b=False: _GroupedGemm.apply(a, b, sizes, trans_b)  # noqa: E731
    gg.ops = types.SimpleNamespace(gmm=gmm)  # type: ignore[attr-defined]
    gg.backend = types.SimpleNamespace(gmm=gmm)  # type: ignore[attr-defined]
    sys.modules.setdefault("grouped_gemm", gg)

    from megatron.core import fp8_utils
    from megatron.core.tensor_parallel import random as mrandom
    from megatron.core.transformer.moe import grouped_gemm_util, moe_utils

    grouped_gemm_util.grouped_gemm = sys.modules["grouped_gemm"]
    grouped_gemm_util.ops = sys.modules["grouped_gemm"].ops
    mrandom._set_cuda_rng_state = lambda *a, **k: None
    mrandom.CudaRNGStatesTracker.fork = lambda self, name=None: contextlib.nullcontext()
    no_fp8 = types.SimpleNamespace(is_fp8_enabled=lambda: False)
    for module, name, value in (
        (moe_utils, "te_general_gemm", None),
        (fp8_utils, "FP8GlobalStateManager", no_fp8),
        (mrandom, "FP8GlobalStateManager", no_fp8),
        (mrandom, "activation_recompute_forward", lambda **k: contextlib.nullcontext()),
        (mrandom, "fp8_autocast", lambda **k: contextlib.nullcontext()),
    ):
        if not hasattr(module, name):
            setattr(module, name, value)


class _StandInLinear(torch.nn.Module):
    """Transformer Engine's (grouped) linear layers for a constructor-only build: no weights, no checks of TE's
    own (TE is absent on CI); the Megatron-Core module that builds it runs all of its own."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__()


def moe_submodules() -> Any:
    """The TE layer spec's MoE submodules (``TEGroupedMLP`` experts, ``SharedExpertMLP``, the default
    ``TopKRouter``; ``megatron/core/models/gpt/moe_module_specs.py`` of megatron-core 0.16.1) with TE's linear
    layers stood in for by :class:`_StandInLinear`."""
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.moe.experts import TEGroupedMLP
    from megatron.core.transformer.moe.moe_layer import MoESubmodules
    from megatron.core.transformer.moe.shared_experts import SharedExpertMLP
    from megatron.core.transformer.spec_utils import ModuleSpec

    mlp = MLPSubmodules(linear_fc1=_StandInLinear, linear_fc2=_StandInLinear)
    return MoESubmodules(
        experts=ModuleSpec(module=TEGroupedMLP, submodules=mlp),
        shared_experts=ModuleSpec(module=SharedExpertMLP, submodules=mlp),
    )


@contextlib.contextmanager
def moe_constructors() -> Any:
    """Megatron-Core's MoE layer constructible on a CPU without CUDA, Transformer Engine or DeepEP, for the
    duration: a CPU ``torch.cuda.Stream`` (the all-to-all dispatcher's and the shared experts' side streams),
    DeepEP's fused dispatch present (the flex dispatcher's DeepEP manager refuses to build without it; nothing
    is dispatched) and its SM setting a no-op, TE's FP8 padding modules (``TEGroupedMLP`` asserts TE under
    FP8) as :class:`_StandInLinear`, TE's ``TELinear`` a class of its own (the shared experts test their
    linear layer against it under FP8) and TE's ``set_save_original_input`` (which marks a TE module to keep its
    unquantized input, under FP8 with ``moe_act`` recompute) a no-op. Every assertion of the layer, its router, dispatcher and experts runs."""
    from unittest.mock import patch

    from megatron.core.extensions import transformer_engine as te_ext
    from megatron.core.transformer.moe import experts, token_dispatcher

    with contextlib.ExitStack() as stack:
        stack.enter_context(patch.object(torch.cuda, "Stream", _Stream))
        stack.enter_context(patch.object(token_dispatcher, "fused_dispatch", object(), create=True))
        stack.enter_context(patch.object(token_dispatcher, "set_deepep_num_sms", lambda n: None, create=True))
        stack.enter_context(patch.object(experts, "HAVE_TE", True))
        stack.enter_context(patch.object(te_ext, "TELinear", type("TELinear", (), {}), create=True))
        stack.enter_context(patch.object(te_ext, "set_save_original_input", lambda module: None, create=True))
        for name in ("Fp8Padding", "Fp8Unpadding"):
            stack.enter_context(patch.object(experts, name, _StandInLinear, create=True))
        yield
