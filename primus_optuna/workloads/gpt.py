"""A real, small training workload: ``python -m primus_optuna.workloads.gpt`` (torchrun-compatible).

Trains a GPT (or top-k MoE) decoder built from :class:`~primus_optuna.workloads.layer.TransformerLayer` on
synthetic tokens with data parallelism (``DistributedDataParallel`` over ``torch.distributed``: gloo on CPU,
NCCL on GPU), micro-batches with gradient accumulation up to the global batch, and recompute
none/selective/full. It prints Megatron/Primus-format lines on the last rank, e.g.::

     iteration        3/       5 | consumed samples:           48 | elapsed time per iteration (ms): 812.4 |
     throughput per GPU (TFLOP/s/GPU): 0.1 | tokens/s/GPU inst/harmonic mean: 1260.3/1255.0 | ... |
     global batch size:    16 | lm loss: 6.931E+00 |

followed by its peak memory and a steady-state summary (median over iterations after ``--warmup-iters``,
the same rule :func:`primus_optuna.run.logparse.parse_log` applies); ``--report-json`` writes that summary.

Tensor, pipeline, expert and context parallelism are not implemented: a configuration with tp, pp, ep or
cp > 1 is refused (exit code 2) with a message saying which runner can execute it.

Example (two CPU processes)::

    torchrun --standalone --nproc-per-node 2 -m primus_optuna.workloads.gpt --num-layers 2 --hidden-size 64 \\
        --num-attention-heads 4 --ffn-hidden-size 128 --vocab-size 256 --seq-length 32 \\
        --global-batch-size 8 --micro-batch-size 2 --train-iters 4
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import sys
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch import nn

from ..physics.shapes import LayerShape
from ..spec.recompute import canonical_recompute, parse_recompute
from .layer import TransformerLayer

EXIT_REFUSED = 2


class GPT(nn.Module):
    """Embedding, ``num_layers`` :class:`TransformerLayer` s, final RMSNorm and an untied output layer."""

    def __init__(self, shape: LayerShape, num_layers: int, vocab: int, recompute: str) -> None:
        super().__init__()
        self.embed = nn.Embedding(vocab, shape.hidden)
        n = parse_recompute(recompute).num_layers  # full:N: the first N layers (one chunk: no pipeline here)
        self.layers = nn.ModuleList(
            TransformerLayer(shape, recompute if not n or i < n else "none") for i in range(num_layers)
        )
        self.norm = nn.RMSNorm(shape.hidden)
        self.output = nn.Linear(shape.hidden, vocab, bias=False)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        """``tokens`` ``[mbs, seq]`` → logits ``[seq, mbs, vocab]`` (Megatron's sequence-first layout)."""
        x = self.embed(tokens.t())
        for layer in self.layers:
            x = layer(x)
        return self.output(self.norm(x))


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m primus_optuna.workloads.gpt", description=__doc__.splitlines()[0]
    )
    a = p.add_argument
    a("--num-layers", type=int, default=2)
    a("--hidden-size", type=int, default=128)
    a("--ffn-hidden-size", type=int, default=512)
    a("--num-attention-heads", type=int, default=4)
    a("--num-query-groups", type=int, default=None)
    a("--vocab-size", type=int, default=1024)
    a("--num-experts", type=int, default=None, help="MoE experts (omit or 1 for a dense MLP)")
    a("--moe-router-topk", type=int, default=2)
    a("--moe-ffn-hidden-size", type=int, default=None)
    a("--no-swiglu", action="store_true", help="GeLU MLP instead of SwiGLU")
    a("--seq-length", type=int, default=128)
    a("--global-batch-size", type=int, default=16)
    a("--micro-batch-size", type=int, default=1)
    a("--recompute", type=canonical_recompute, default="none", help="none, selective[:modules], full[:N]")
    a("--tensor-model-parallel-size", type=int, default=1)
    a("--pipeline-model-parallel-size", type=int, default=1)
    a("--expert-model-parallel-size", type=int, default=1)
    a("--context-parallel-size", type=int, default=1)
    a("--train-iters", type=int, default=5)
    a("--log-interval", type=int, default=1)
    a("--warmup-iters", type=int, default=2, help="iterations left out of the steady-state summary")
    a("--lr", type=float, default=1e-4)
    a("--device", choices=("auto", "cpu", "cuda"), default="auto")
    a("--dtype", choices=("auto", "fp32", "bf16"), default="auto", help="auto: bf16 on GPU, fp32 on CPU")
    a("--seed", type=int, default=0)
    a("--report-json", type=Path, default=None, help="write the steady-state summary here (last rank)")
    return p.parse_args(argv)


def refusal(args: argparse.Namespace, world: int) -> str | None:
    """Why this workload cannot run ``args`` (None when it can)."""
    for name, flag in (
        ("tp", "tensor_model_parallel_size"),
        ("pp", "pipeline_model_parallel_size"),
        ("ep", "expert_model_parallel_size"),
        ("cp", "context_parallel_size"),
    ):
        if getattr(args, flag) > 1:
            return (
                f"the local workload runs data parallelism only; {name}={getattr(args, flag)} needs Megatron-LM or "
                f"Primus (runner kind megatron or primus), or restrict search.axes.{name} to [1]"
            )
    if args.global_batch_size % (args.micro_batch_size * world):
        return (
            f"global batch {args.global_batch_size} is not divisible by micro-batch × data-parallel size "
            f"{args.micro_batch_size}×{world}"
        )
    if args.hidden_size % args.num_attention_heads:
        return "hidden size must be divisible by the attention heads"
    if args.train_iters <= args.warmup_iters:
        return f"--train-iters must exceed --warmup-iters ({args.warmup_iters}) to measure a steady state"
    return None


def layer_shape(args: argparse.Namespace) -> LayerShape:
    moe = (args.num_experts or 1) > 1
    heads = args.num_attention_heads
    return LayerShape(
        hidden=args.hidden_size,
        heads=heads,
        groups=args.num_query_groups or heads,
        head_dim=args.hidden_size // heads,
        ffn=args.ffn_hidden_size,
        seq=args.seq_length,
        mbs=args.micro_batch_size,
        moe=moe,
        experts=args.num_experts or 1,
        local_experts=args.num_experts or 1,
        topk=args.moe_router_topk if moe else 1,
        expert_ffn=(args.moe_ffn_hidden_size or args.ffn_hidden_size) if moe else 0,
        swiglu=not args.no_swiglu,
    )


def flops_per_token(args: argparse.Namespace, shape: LayerShape) -> float:
    """Model training FLOPs per token (3× forward, causal attention; recompute not counted), for TFLOP/s."""
    h, s = shape.hidden, shape.seq
    attn = 2 * h * (shape.heads + 2 * shape.groups) * shape.head_dim + 2 * shape.heads * shape.head_dim * h
    core = 2 * s * shape.heads * shape.head_dim  # QK^T and PV, causal half of 2·2·s·a·d
    fc1 = 2 if shape.swiglu else 1
    if shape.moe:
        mlp = 2 * h * shape.experts + shape.topk * 2 * (fc1 + 1) * h * shape.expert_ffn
    else:
        mlp = 2 * (fc1 + 1) * h * shape.ffn
    return 3 * (args.num_layers * (attn + core + mlp) + 2 * h * args.vocab_size)


def peak_memory_gib(device: torch.device) -> tuple[float, str]:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30, "allocator peak"
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, "process peak RSS"  # KiB on Linux


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    world = int(os.environ.get("WORLD_SIZE", "1"))
    rank = int(os.environ.get("RANK", "0"))
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    last = rank == world - 1
    why = refusal(args, world)
    if why:
        if rank == 0:
            print(f"error: refused: {why}", file=sys.stderr, flush=True)
        return EXIT_REFUSED
    use_cuda = args.device == "cuda" or (args.device == "auto" and torch.cuda.is_available())
    device = torch.device(f"cuda:{local_rank}" if use_cuda else "cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    dtype = torch.bfloat16 if args.dtype == "bf16" or (args.dtype == "auto" and use_cuda) else torch.float32
    if world > 1:
        dist.init_process_group("nccl" if use_cuda else "gloo")
    torch.manual_seed(args.seed)
    shape = layer_shape(args)
    model: nn.Module = GPT(shape, args.num_layers, args.vocab_size, args.recompute).to(
        device=device, dtype=dtype
    )
    if world > 1:
        model = nn.parallel.DistributedDataParallel(model, device_ids=[local_rank] if use_cuda else None)
    opt = torch.optim.AdamW(model.parameters(), lr=args.lr)
    micro = args.global_batch_size // (args.micro_batch_size * world)
    gen = torch.Generator(device="cpu").manual_seed(args.seed * 1000 + rank)
    tokens_per_step = args.seq_length * args.global_batch_size
    fpt = flops_per_token(args, shape)
    inst: list[tuple[int, float, float]] = []  # (iteration, elapsed_ms, tokens/s/GPU)
    if last:
        print(
            f"> local GPT workload: world={world} device={device.type} dtype={str(dtype).removeprefix('torch.')} "
            f"layers={args.num_layers} hidden={args.hidden_size} moe={shape.moe} mbs={args.micro_batch_size} "
            f"micro-batches={micro} recompute={args.recompute}",
            flush=True,
        )
    for it in range(1, args.train_iters + 1):
        if use_cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        total = 0.0
        for j in range(micro):
            batch = torch.randint(
                0, args.vocab_size, (args.micro_batch_size, args.seq_length + 1), generator=gen
            )
            batch = batch.to(device)
            sync = j == micro - 1 or world == 1
            ctx = model.no_sync() if (world > 1 and not sync) else _null()
            with ctx:
                logits = model(batch[:, :-1])
                loss = F.cross_entropy(
                    logits.float().reshape(-1, args.vocab_size), batch[:, 1:].t().reshape(-1)
                )
                (loss / micro).backward()
            total += loss.item() / micro
        opt.step()
        opt.zero_grad(set_to_none=True)
        if use_cuda:
            torch.cuda.synchronize(device)
        elapsed = torch.tensor([time.perf_counter() - t0], dtype=torch.float64)
        if world > 1:  # the step ends when the slowest rank ends
            dist.all_reduce(elapsed, op=dist.ReduceOp.MAX)
        ms = float(elapsed.item()) * 1000
        tps = tokens_per_step / (ms / 1000) / world
        inst.append((it, ms, tps))
        if last and it % args.log_interval == 0:
            harmonic = len(inst) / sum(1 / x[2] for x in inst)
            print(
                f" iteration {it:8d}/{args.train_iters:8d} | consumed samples: {it * args.global_batch_size:12d} | "
                f"elapsed time per iteration (ms): {ms:.1f} | "
                f"throughput per GPU (TFLOP/s/GPU): {fpt * tps / 1e12:.4f} | "
                f"tokens/s/GPU inst/harmonic mean: {tps:.1f}/{harmonic:.1f} | learning rate: {args.lr:E} | "
                f"global batch size: {args.global_batch_size:5d} | lm loss: {total:E} | loss scale: 1.0 | "
                "number of skipped iterations:   0 | number of nan iterations:   0 |",
                flush=True,
            )
    peak, what = peak_memory_gib(device)
    peak_t = torch.tensor([peak], dtype=torch.float64)
    if world > 1:
        dist.all_reduce(peak_t, op=dist.ReduceOp.MAX)
        dist.barrier()
    if last:
        steady = [x for x in inst if x[0] > args.warmup_iters]
        report: dict[str, Any] = {
            "tokens_per_s_per_gpu": statistics.median(round(x[2], 1) for x in steady),
            "step_time_s": statistics.median(round(x[1], 1) for x in steady) / 1000,
            "iterations_averaged": [x[0] for x in steady],
            "peak_memory_gib": float(peak_t.item()),
            "world": world,
            "device": device.type,
        }
        print(f"peak memory (GiB): {report['peak_memory_gib']:.3f} ({what}, max over ranks)", flush=True)
        print(
            f"steady state: tokens/s/GPU {report['tokens_per_s_per_gpu']:.1f}, step {report['step_time_s']:.4f} s "
            f"(median of iterations {report['iterations_averaged']})",
            flush=True,
        )
        if args.report_json:
            args.report_json.write_text(json.dumps(report, indent=2) + "\n")
    if world > 1:
        dist.barrier()  # both ranks tear down together (gloo aborts when a peer vanishes mid-teardown)
        dist.destroy_process_group()
    return 0


class _null:
    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: object) -> None:
        return None


if __name__ == "__main__":
    sys.exit(main())
