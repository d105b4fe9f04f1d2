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
