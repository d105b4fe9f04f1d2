"""The ``profile`` runner: time one real layer on the local device and project the cluster's throughput.

For a configuration it builds the per-GPU shape of one transformer layer
(:meth:`~primus_optuna.physics.shapes.LayerShape.from_config`: hidden and heads split by tp, sequence by cp,
experts by ep with their tokens per local expert, the micro-batch), instantiates the Megatron-like torch layer
of :mod:`primus_optuna.workloads.layer` with the configuration's recompute, and times forward + backward of
one micro-batch on the local device (CUDA/ROCm) after warm-up iterations, taking the median of repeated
timings. A study on an AMD/NVIDIA GPU is profiled on the CPU only when ``runner.options.device: cpu`` says so
(each trial then logs a warning); with ``auto`` and no GPU the runner refuses to start (:class:`SpecError`). Results are cached by (shape, recompute, dtype, device) in a JSON file.

Projection (``source="profiled"``): the step-time model's layer compute terms (``compute_attention``,
``compute_mlp``, ``recompute``) are replaced by the measurement — ``t_layer × layers per pipeline stage ×
micro-batches`` — keeping their analytical split; the ``pipeline_bubble`` keeps its schedule formula but is
evaluated with the measured per-micro-batch time (scaled by the same ratio); ``compute_other`` (embedding,
logits), every communication term and the optimizer stay analytical. tokens/s/GPU = tokens per step /
projected step time / world.

``scale`` < 1 (for CPU-only machines and tests) shrinks the sequence, hidden size, KV groups (heads keep their
GQA ratio) and FFN widths by ``scale`` and corrects the measured time by the ratio of the full shape's to the
scaled shape's GEMM and attention time on the study GPU family's per-shape curves
(:func:`~primus_optuna.physics.gemm_efficiency.layer_gemm_seconds`): small GEMMs run at a lower fraction of
peak, so the correction is below the plain FLOP ratio (``details`` records both). It stays a smoke-test
approximation, not a measurement of the full shape.

Example::

    runner = ProfileRunner(spec, scale=0.05, repeats=3)
    runner.run(config, RunContext(spec, workdir=Path("runs/trial-0"))).tokens_per_s_per_gpu
"""

from __future__ import annotations

import dataclasses
import json
import os
import platform
import statistics
import time
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from ..errors import SpecError
from ..physics.calibration import family_constants
from ..physics.gemm_efficiency import layer_gemm_seconds
from ..physics.layer_mix import stage_mixes
from ..physics.shapes import LayerShape
from ..physics.throughput import estimate_throughput
from ..search.logs import get_logger
from ..space import TrainingConfig
from ..spec import StudySpec
from ..spec.recompute import parse_recompute
from .base import LaunchFailure, Measurement, OutOfMemory, RunContext

ATTN_BWD_FACTOR = 2.5
"""FlashAttention-2 backward / forward FLOPs (Dao 2023), as in :mod:`primus_optuna.physics.flops`."""
GPU_VENDORS = ("amd", "nvidia")
"""a study on these GPUs is not profiled on the CPU unless ``device: cpu`` says so"""
CPU_WARNING = (
    "warning: trial %s is profiled on the CPU (runner.options.device: cpu) for a %s study: its tokens/s/GPU "
    "is a smoke-test figure, not the GPU's"
)
log = get_logger(__name__)
LAYER_TERMS = ("compute_attention", "compute_mlp", "recompute")
CACHE_NAME = "profile_cache.json"


class ProfileOptions(BaseModel):
    """``runner.kind: profile`` options."""

    model_config = ConfigDict(extra="forbid")

    scale: float = Field(default=1.0, gt=0, le=1, description="shrink factor of the profiled shape")
    warmup: int = Field(default=2, ge=0)
    repeats: int = Field(default=5, ge=1)
    device: Literal["auto", "cpu", "cuda"] = "auto"
    dtype: Literal["auto", "bf16", "fp32"] = "auto"
    """auto: bf16 on a GPU, fp32 on CPU (CPU bf16 kernels are not representative)"""
    cache: str | None = Field(default=None, description="cache file; default <runs dir>/profile_cache.json")
    seed: int = 0


def scaled_shape(shape: LayerShape, scale: float) -> LayerShape:
    """``shape`` with sequence, hidden, KV groups (heads keep the GQA ratio) and FFN widths × ``scale``."""
    if scale >= 1.0:
        return shape
    groups = max(1, round(shape.groups * scale))
    seq = max(2 * shape.tp, round(shape.seq * scale))
    return dataclasses.replace(
        shape,
        seq=seq - seq % shape.tp,
        hidden=max(16, round(shape.hidden * scale)),
        groups=groups,
        heads=groups * (shape.heads // shape.groups),
        ffn=max(16, round(shape.ffn * scale)),
        expert_ffn=max(16, round(shape.expert_ffn * scale)) if shape.moe else shape.expert_ffn,
    )


def layer_flops(shape: LayerShape, recompute: str = "none") -> float:
    """FLOPs of forward + backward (+ recomputed forward) of one layer at ``shape`` for one micro-batch."""
    t, h, d = shape.tokens, shape.hidden, shape.head_dim
    a, g = shape.heads, shape.groups
    attn_gemm = 2 * t * h * (a + 2 * g) * d + 2 * t * a * d * h
    core = 2 * 2 * shape.mbs * shape.seq * shape.seq * a * d * 0.5  # causal half of QKᵀ and PV
    fc1 = 2 if shape.swiglu else 1
    if shape.moe:
        lt = shape.local_tokens
        mlp = 2 * lt * h * shape.experts + shape.topk * lt * 2 * (fc1 + 1) * h * shape.expert_ffn
    else:
        mlp = 2 * t * (fc1 + 1) * h * shape.ffn
    fwd = attn_gemm + core + mlp
    total = 3 * (attn_gemm + mlp) + (1 + ATTN_BWD_FACTOR) * core
    r = parse_recompute(recompute)
    if r.is_full:
        total += fwd  # the profiled layer is a recomputed one (full:N: the first N of each chunk)
    elif r.has("core_attn"):
        total += core
    return float(total)


def _device_name(device: str) -> str:
    if device.startswith("cuda"):
        import torch

        return torch.cuda.get_device_name(device)
    return f"cpu:{platform.machine()}:{os.cpu_count()}cores"


def time_layer(
    shape: LayerShape,
    recompute: str,
    *,
    device: str = "cpu",
    dtype: str = "fp32",
    warmup: int = 2,
    repeats: int = 5,
    seed: int = 0,
) -> dict[str, Any]:
    """Median seconds of forward + backward of one layer (fresh input each time, gradients accumulate)."""
    import torch

    from ..workloads.layer import build_layer, make_input

    torch.manual_seed(seed)
    tdtype = torch.bfloat16 if dtype == "bf16" else torch.float32
    cuda = device.startswith("cuda")
    layer = build_layer(shape, recompute, dtype=tdtype, device=device)
    times: list[float] = []
    for i in range(warmup + repeats):
        x = make_input(shape, dtype=tdtype, device=device)
        grad = torch.randn(x.shape, dtype=tdtype, device=device)
        if cuda:
            torch.cuda.synchronize(device)
        t0 = time.perf_counter()
        layer(x).backward(grad)
        if cuda:
            torch.cuda.synchronize(device)
        if i >= warmup:
            times.append(time.perf_counter() - t0)
    return {"fwd_bwd_s": statistics.median(times), "times_s": times}


class ProfileRunner:
    """Profile one layer on this device; project the cluster's tokens/s/GPU."""

    kind = "profile"
    measures_cluster_memory = False
    """its memory figures (and out-of-memory failures) are the local device's, not the cluster GPU's"""

    def __init__(
        self,
        spec: StudySpec,
        *,
        scale: float = 1.0,
        warmup: int = 2,
        repeats: int = 5,
        device: str = "auto",
        dtype: str = "auto",
        cache: str | Path | None = None,
        seed: int = 0,
    ) -> None:
        self.spec = spec
        self.options = ProfileOptions(
            scale=scale,
            warmup=warmup,
            repeats=repeats,
            device=device,  # type: ignore[arg-type]
            dtype=dtype,  # type: ignore[arg-type]
            cache=str(cache) if cache else None,
            seed=seed,
        )
        self.hits = 0
        self.misses = 0
        self.cpu_for_gpu = False
        """CPU timings stand in for the study's GPU (only with ``device: cpu`` given explicitly)"""
        if spec.cluster.gpu.vendor in GPU_VENDORS:
            self.cpu_for_gpu = self._device()[0] == "cpu"

    @classmethod
    def from_options(cls, spec: StudySpec, options: dict[str, Any]) -> ProfileRunner:
        """Build from ``runner.options`` (validated by :class:`ProfileOptions`)."""
        from .presets import validate_options

        o: ProfileOptions = validate_options(ProfileOptions, options, "profile")
        return cls(spec, **o.model_dump())

    # --- device ----------------------------------------------------------------------------------------------
    def _device(self) -> tuple[str, str]:
        import torch

        want = self.options.device
        if want == "cuda" and not torch.cuda.is_available():
            raise LaunchFailure("runner.options.device is cuda but torch sees no GPU (CUDA/ROCm)")
        device = "cuda:0" if want == "cuda" or (want == "auto" and torch.cuda.is_available()) else "cpu"
        gpu = self.spec.cluster.gpu
        if device == "cpu" and want != "cpu" and gpu.vendor in GPU_VENDORS:
            raise SpecError(
                f"runner.kind profile: torch sees no GPU on this machine, and CPU timings would stand in for the "
                f"study's {gpu.name} (tokens/s/GPU off by orders of magnitude); run it on a machine with a GPU, "
                "use runner.kind analytical, or set runner.options.device: cpu to accept CPU timings knowingly"
            )
        dtype = self.options.dtype
        if dtype == "auto":
            dtype = "bf16" if device != "cpu" else "fp32"
        return device, dtype

    def _cache_path(self, context: RunContext) -> Path:
        return Path(self.options.cache) if self.options.cache else context.workdir.parent / CACHE_NAME

    # --- measuring -------------------------------------------------------------------------------------------
    def profile_layer(
        self, shape: LayerShape, recompute: str, cache_path: Path | None = None
    ) -> dict[str, Any]:
        """Seconds of fwd+bwd of one layer at ``shape`` (full size: FLOP-corrected when ``scale`` < 1)."""
        device, dtype = self._device()
        small = scaled_shape(shape, self.options.scale)
        key = json.dumps(
            {
                "shape": dataclasses.asdict(small),
                "recompute": recompute,
                "device": _device_name(device),
                "dtype": dtype,
                "warmup": self.options.warmup,
                "repeats": self.options.repeats,
            },
            sort_keys=True,
        )
        cache: dict[str, Any] = {}
        if cache_path is not None and cache_path.is_file():
            try:
                cache = json.loads(cache_path.read_text())
            except json.JSONDecodeError:
                cache = {}
        if key in cache:
            self.hits += 1
            timed = cache[key]
            hit = True
        else:
            self.misses += 1
            hit = False
            try:
                timed = time_layer(
                    small,
                    recompute,
                    device=device,
                    dtype=dtype,
                    warmup=self.options.warmup,
                    repeats=self.options.repeats,
                    seed=self.options.seed,
                )
            except RuntimeError as exc:  # torch.OutOfMemoryError is a RuntimeError
                if "out of memory" in str(exc).lower():
                    raise OutOfMemory(
                        f"profiling the layer ran out of memory: {exc}", log_tail=str(exc)
                    ) from None
                raise
            if cache_path is not None:
                cache_path.parent.mkdir(parents=True, exist_ok=True)
                fresh = json.loads(cache_path.read_text()) if cache_path.is_file() else {}
                fresh[key] = timed
                tmp = cache_path.with_suffix(f".{os.getpid()}.tmp")
                tmp.write_text(json.dumps(fresh, indent=1))
                tmp.replace(cache_path)
        flop_ratio = layer_flops(shape, recompute) / layer_flops(small, recompute)
        correction = flop_ratio
        if small != shape:  # scale the timing by the curves (the recompute share scales like the rest)
            fam = family_constants(self.spec.cluster.gpu)
            peak = self.spec.cluster.gpu.bf16_tflops * 1e12
            full_s = layer_gemm_seconds(shape, fam.gemm, fam.attention, peak, fam.attention_bwd_rate)
            small_s = layer_gemm_seconds(small, fam.gemm, fam.attention, peak, fam.attention_bwd_rate)
            correction = full_s / small_s * (flop_ratio / (layer_flops(shape) / layer_flops(small)))
        return {
            "layer_s": timed["fwd_bwd_s"] * correction,
            "measured_s": timed["fwd_bwd_s"],
            "flop_correction": flop_ratio,
            "shape_correction": correction,
            "profiled_shape": dataclasses.asdict(small),
            "device": _device_name(device),
            "dtype": dtype,
            "cache_hit": hit,
        }

    # --- projection ------------------------------------------------------------------------------------------
    def run(self, config: TrainingConfig, context: RunContext) -> Measurement:
        spec = self.spec
        config = config.derive(spec.world, spec.workload.global_batch_size)
        if not config.num_microbatches:
            raise LaunchFailure(f"{config}: the global batch does not split into whole micro-batches")
        shape = LayerShape.from_config(spec, config)
        if self.cpu_for_gpu:
            log.warning(CPU_WARNING, context.trial_number, spec.cluster.gpu.name)
        prof = self.profile_layer(shape, config.recompute, self._cache_path(context))
        est = estimate_throughput(spec, config)
        b = dict(est.breakdown_s)
        layers_per_stage = _stage_layers(spec, config, est.busiest_stage)
        measured = prof["layer_s"] * layers_per_stage * config.num_microbatches
        analytical = sum(b.get(k, 0.0) for k in LAYER_TERMS)
        ratio = measured / analytical if analytical > 0 else 1.0
        new = dict(b)
        for k in (*LAYER_TERMS, "pipeline_bubble"):
            if k in new:
                new[k] = b[k] * ratio
        if analytical <= 0:
            new["compute_mlp"] = b.get("compute_mlp", 0.0) + measured
        step = est.step_time_s + sum(new.values()) - sum(b.values())
        tokens = spec.tokens_per_step / step / spec.world
        return Measurement(
            tokens_per_s_per_gpu=tokens,
            step_time_s=step,
            source="profiled",
            details={
                **prof,
                "layers_per_stage": layers_per_stage,
                "num_microbatches": config.num_microbatches,
                "measured_layer_compute_s": measured,
                "analytical_layer_compute_s": analytical,
                "compute_ratio": ratio,
                "breakdown_s": {k: round(v, 6) for k, v in new.items()},
                "analytical_step_time_s": est.step_time_s,
                "scale": self.options.scale,
                "cache_hits": self.hits,
                "cache_misses": self.misses,
                **({"warning": "CPU timings stand in for the study's GPU"} if self.cpu_for_gpu else {}),
            },
        )


def _stage_layers(spec: StudySpec, config: TrainingConfig, stage: int) -> float:
    """Layers (decoder + MTP) of pipeline stage ``stage`` (the estimate's busiest, whose compute terms the
    breakdown holds) under the study's pipeline layout (the even split ``num_layers / pp`` when the layout does
    not apply)."""
    schedule = config.pp_schedule if config.pp > 1 else "1f1b"
    vpp = 2 if schedule == "zbv" else (config.vpp if schedule == "interleaved" else 1)
    mixes = stage_mixes(spec.model, spec.pipeline, config.pp, vpp, schedule)
    if not mixes:
        return spec.model.num_layers / config.pp
    mx = mixes[stage]
    return float(mx.decoder + mx.mtp)
