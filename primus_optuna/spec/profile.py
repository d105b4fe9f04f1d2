"""The hardware profile: what ``primus-optuna calibrate`` measured on one node, as a versioned YAML document.

A study points at one with ``cluster.profile: PATH`` (relative to the study file); the physics then prices
GEMMs, attention and memory-bound kernels from its tables instead of the catalog's efficiency constants
(:mod:`primus_optuna.physics.measured`). The document (``schema_version: 1``)::

    schema_version: 1
    created: '2026-12-06T22:10:00Z'
    device: {kind: cuda, name: NVIDIA H100 80GB HBM3, count: 8, threads: null, torch: 2.9.0, cuda: '12.8',
             hip: null, cudnn: 91002, nccl: 2.27.3, driver: 570.124.06, cpu: x86_64}
    compute_dtype: bf16        # the dtype a 16-bit training runs its GEMMs in on this device
    budget_s: 300.0
    elapsed_s: 291.4
    gemm:                      # seconds of one [m, k] x [k, n] GEMM (count > 1: a grouped GEMM of count experts)
      - {dtype: bf16, m: 4096, n: 4096, k: 4096, count: 1, seconds: 0.000181, tflops: 759.3, kernel: matmul}
    attention:                 # torch SDPA, causal; flops as the physics counts them (forward 4·b·h·s²·d / 2)
      - {seq: 4096, head_dim: 128, heads: 32, batch: 1, dtype: bf16, fwd_s: 0.0021, bwd_s: 0.0062,
         fwd_tflops: 520.0, bwd_tflops: 440.0}
    memory:                    # memory-bound kernels: bytes read + written per call
      - {kernel: copy, bytes: 268435456, seconds: 0.0001, gbs: 2684.0, dtype: bf16}
    op_overhead_us: 9.5        # the framework's own cost per kernel (a tiny layer's forward + backward)
    allocator: {applicable: true, allocated_gib: 10.2, reserved_gib: 11.1, reserve_fraction: 0.081}
    collectives:
      backend: nccl
      ranks: 8
      points: [{op: all_reduce, ranks: 8, bytes: 1048576, seconds: 4.1e-05, algbw_gbs: 25.6, busbw_gbs: 44.8}]
      unsupported: {}          # op -> why it was not measured (e.g. gloo without reduce_scatter)
    fitted:                    # the saturating curves fitted to the tables (what lies beyond them)
      gemm: {bf16: {peak_tflops: 780.0, half_work: 2.1e9, mape: 0.06}}
      attention_fwd: {peak_tflops: 560.0, half_span: 520.0, mape: 0.04}
      attention_bwd: {peak_tflops: 470.0, half_span: 600.0, mape: 0.05}
      memory: {bandwidth_gbs: 2900.0, kernel_us: 3.1, mape: 0.08}

Example::

    profile = load_profile("h100-node.yaml")
    profile.gemm_points("bf16")
"""

from __future__ import annotations

import os
import tempfile
from pathlib import Path
from typing import Any, Literal

import yaml
from pydantic import ConfigDict, Field, ValidationError

from ..errors import SpecError
from .strict import StrictIntModel

SCHEMA_VERSION = 1
"""the profile document's version; a reader refuses any other"""

DTYPES = ("fp32", "bf16", "fp16", "fp8")
COLLECTIVES = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv")
MEMORY_KERNELS = ("copy", "add", "rmsnorm")


class _Strict(StrictIntModel):
    model_config = ConfigDict(extra="forbid")


class DeviceInfo(_Strict):
    """The measured node: device kind and name, how many, and the software that ran the kernels."""

    kind: Literal["cpu", "cuda"]
    """``cuda``: NVIDIA (CUDA) or AMD (ROCm/HIP) GPUs through torch's ``cuda`` device"""
    name: str
    count: int = Field(gt=0)
    """devices on the node (CPU: the processes the collectives ran between, each ``threads`` wide)"""
    threads: int | None = None
    """CPU: torch threads per process (the ``local`` runner's rule: cores / processes)"""
    torch: str
    cuda: str | None = None
    hip: str | None = None
    cudnn: int | None = None
    nccl: str | None = None
    driver: str | None = None
    cpu: str = ""


class GemmPoint(_Strict):
    """One measured GEMM ``[m, k] x [k, n]`` (``count`` > 1: a grouped GEMM, ``m`` rows per expert)."""

    dtype: Literal["fp32", "bf16", "fp16", "fp8"]
    m: int = Field(gt=0)
    n: int = Field(gt=0)
    k: int = Field(gt=0)
    count: int = Field(default=1, gt=0)
    seconds: float = Field(gt=0)
    tflops: float = Field(gt=0)
    kernel: str = ""
    """what ran it: ``matmul``, ``_scaled_mm`` (FP8), ``_grouped_mm`` or ``bmm`` (grouped)"""

    @property
    def work(self) -> float:
        """Multiply-adds of the whole kernel (the physics' GEMM size)."""
        return float(self.m) * self.n * self.k * self.count


class AttentionPoint(_Strict):
    """One measured causal SDPA call, forward and backward (FLOPs counted as the physics counts them)."""

    seq: int = Field(gt=0)
    head_dim: int = Field(gt=0)
    heads: int = Field(gt=0)
    batch: int = Field(gt=0)
    dtype: Literal["fp32", "bf16", "fp16", "fp8"]
    fwd_s: float = Field(gt=0)
    bwd_s: float = Field(gt=0)
    fwd_tflops: float = Field(gt=0)
    bwd_tflops: float = Field(gt=0)

    @property
    def span(self) -> float:
        """Keys per query of the causal mask (the attention curve's size)."""
        return self.seq / 2


class MemoryPoint(_Strict):
    """One memory-bound kernel: ``bytes`` read and written per call."""

    kernel: Literal["copy", "add", "rmsnorm"]
    bytes: int = Field(gt=0)
    seconds: float = Field(gt=0)
    gbs: float = Field(gt=0)
    dtype: Literal["fp32", "bf16", "fp16"] = "bf16"
    """the elements' dtype (the physics counts 16-bit activations: fp32 elements move twice its bytes)"""


class AllocatorReserve(_Strict):
    """The caching allocator's reserve on a representative layer's forward and backward."""

    applicable: bool
    reason: str | None = None
    """why not measured (CPU: torch's caching allocator is CUDA's)"""
    allocated_gib: float | None = None
    """``torch.cuda.max_memory_allocated``"""
    reserved_gib: float | None = None
    """``torch.cuda.max_memory_reserved``"""
    reserve_fraction: float | None = None
    """(reserved − allocated) / reserved: the part of the device a job holds but cannot use"""


class CollectivePoint(_Strict):
    op: Literal["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "send_recv"]
    ranks: int = Field(gt=1)
    bytes: int = Field(gt=0)
    """message size per rank, as nccl-tests counts it (all-gather: the gathered output)"""
    seconds: float = Field(gt=0)
    algbw_gbs: float = Field(ge=0)
    busbw_gbs: float = Field(ge=0)
    """nccl-tests' bus bandwidth (PERFORMANCE.md: all-reduce × 2(n−1)/n, all-gather / reduce-scatter ×
    (n−1)/n, all-to-all × (n−1)/n, send/recv × 1)"""


class Collectives(_Strict):
    backend: str | None = None
    ranks: int = 0
    points: list[CollectivePoint] = Field(default_factory=list)
    unsupported: dict[str, str] = Field(default_factory=dict)
    """collective → why it was not measured (the backend lacks it, too few devices, the budget ran out)"""


class SaturatingFit(_Strict):
    """``rate(size) = peak · size / (size + half)`` fitted to a table (size: GEMM multiply-adds or attention
    keys per query), with its mean absolute relative error on the points."""

    peak_tflops: float = Field(gt=0)
    half: float = Field(ge=0)
    mape: float = Field(ge=0)
    points: int = Field(ge=1)


class MemoryFit(_Strict):
    """``seconds(bytes) = bytes / bandwidth + kernel_us`` fitted to the memory-bound kernels."""

    bandwidth_gbs: float = Field(gt=0)
    kernel_us: float = Field(ge=0)
    mape: float = Field(ge=0)
    points: int = Field(ge=1)


class Fitted(_Strict):
    gemm: dict[str, SaturatingFit] = Field(default_factory=dict)
    """per dtype (plain GEMMs)"""
    grouped_gemm: dict[str, SaturatingFit] = Field(default_factory=dict)
    attention_fwd: SaturatingFit | None = None
    attention_bwd: SaturatingFit | None = None
    memory: MemoryFit | None = None


class HardwareProfile(_Strict):
    """A measured node (see the module docstring for the document)."""

    schema_version: Literal[1] = SCHEMA_VERSION
    created: str = ""
    device: DeviceInfo
    compute_dtype: Literal["fp32", "bf16", "fp16"] = "bf16"
    """the dtype a 16-bit (bf16/fp16) training runs its GEMMs and attention in on this device: bf16 on GPUs; fp32
    on CPU, as the ``local`` runner's workload does (``workloads.gpt --dtype auto``)"""
    budget_s: float = Field(default=0.0, ge=0)
    elapsed_s: float = Field(default=0.0, ge=0)
    gemm: list[GemmPoint] = Field(default_factory=list)
    attention: list[AttentionPoint] = Field(default_factory=list)
    memory: list[MemoryPoint] = Field(default_factory=list)
    op_overhead_us: float | None = Field(default=None, ge=0)
    """the framework's own cost per kernel: a tiny transformer layer's forward and backward (its arithmetic
    negligible) over the kernels the step-time model counts in a layer; on CPU the same thread issues and runs
    each kernel, so it adds to every kernel's fixed cost"""
    allocator: AllocatorReserve = Field(
        default_factory=lambda: AllocatorReserve(applicable=False, reason="not measured")
    )
    collectives: Collectives = Field(default_factory=Collectives)
    fitted: Fitted = Field(default_factory=Fitted)

    def gemm_points(self, dtype: str, grouped: bool = False) -> list[GemmPoint]:
        """The plain (or grouped) GEMMs measured in ``dtype``."""
        return [p for p in self.gemm if p.dtype == dtype and (p.count > 1) == grouped]

    def dtypes(self) -> list[str]:
        """The dtypes with plain GEMMs measured."""
        return sorted({p.dtype for p in self.gemm if p.count == 1})

    def to_yaml(self) -> str:
        return yaml.safe_dump(self.model_dump(mode="json"), sort_keys=False, width=120)

    def save(self, path: str | Path) -> Path:
        """Write the profile atomically (a temporary file in the same folder, then renamed): an interrupted
        write leaves no half-written profile."""
        p = Path(path)
        p.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp = tempfile.mkstemp(prefix=f".{p.name}.", suffix=".tmp", dir=p.parent)
        try:
            with os.fdopen(fd, "w", encoding="utf-8") as f:
                f.write(self.to_yaml())
            umask = os.umask(0)
            os.umask(umask)
            os.chmod(tmp, 0o666 & ~umask)  # as an ordinary new file (mkstemp's is private)
            os.replace(tmp, p)
        except BaseException:
            Path(tmp).unlink(missing_ok=True)
            raise
        return p


def profile_from_data(data: Any, source: str) -> HardwareProfile:
    """Validate a profile given as data (what the YAML holds); one :class:`SpecError` naming the problem."""
    if not isinstance(data, dict):
        raise SpecError(
            f"{source}: a hardware profile must be a mapping (written by `primus-optuna calibrate`)"
        )
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise SpecError(
            f"{source}: schema_version {version!r} is not {SCHEMA_VERSION}, the version this primus-optuna "
            "reads; re-run `primus-optuna calibrate` to write a current profile"
        )
    try:
        return HardwareProfile.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(x) for x in e['loc'])}: {e['msg'].removeprefix('Value error, ')}"
            for e in exc.errors()
        )
        raise SpecError(f"{source}: invalid hardware profile: {problems}") from None


def load_profile(path: str | Path) -> HardwareProfile:
    """Read and validate a hardware profile file."""
    p = Path(path)
    if not p.is_file():
        raise SpecError(
            f"hardware profile {str(p)!r} not found; write one with `primus-optuna calibrate --out {p}`"
        )
    try:
        data = yaml.safe_load(p.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, yaml.YAMLError) as exc:
        raise SpecError(f"{p}: cannot read the hardware profile ({exc})") from None
    return profile_from_data(data, str(p))


__all__ = [
    "COLLECTIVES",
    "DTYPES",
    "MEMORY_KERNELS",
    "SCHEMA_VERSION",
    "AllocatorReserve",
    "AttentionPoint",
    "CollectivePoint",
    "Collectives",
    "DeviceInfo",
    "Fitted",
    "GemmPoint",
    "HardwareProfile",
    "MemoryFit",
    "MemoryPoint",
    "SaturatingFit",
    "load_profile",
    "profile_from_data",
]
