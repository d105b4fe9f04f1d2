"""GPU catalog and the :class:`GPUSpec` model.

Figures are public datasheet values (shared/reference/hardware.md); every one of them can be overridden in a
study file. Memory is compared in ONE unit, GiB, through :attr:`GPUSpec.hbm_gib`:

- ``memory_gib`` is the capacity the device reports to the framework (``nvidia-smi``/``rocm-smi``
  memory.total, ``torch.cuda.get_device_properties().total_memory``). HBM stacks are binary-sized, so a
  datasheet's "288 GB" MI355X reports 288 GiB (Primus logs print ``.../288.00GB`` total, in GiB:
  shared/reference/log-formats.md) and a "141 GB" H200 reports ~140 GiB (the device tool of this workplace
  reports "about 139 GiB" free for the H200), not 131 GiB.
- when ``memory_gib`` is not given (an inline GPU), the datasheet ``hbm_gb`` is converted from decimal GB
  to GiB, which is the conservative reading.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

GIB = 2**30
GPUS_PER_NODE = 8
"""GPUs per node when a study's cluster does not say (``cluster.gpus_per_node``)."""
GB = 10**9


class GPUSpec(BaseModel):
    """One accelerator and the links it sees.

    Example::

        GPUSpec.catalog("mi355x").hbm_gib  # 268.2
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str
    vendor: Literal["amd", "nvidia", "other"] = "other"
    bf16_tflops: float = Field(gt=0, description="dense BF16/FP16 peak, TFLOP/s")
    fp8_tflops: float | None = Field(default=None, gt=0, description="dense FP8 peak, TFLOP/s; None = no FP8")
    hbm_gb: float = Field(gt=0, description="HBM capacity as the datasheet states it (GB)")
    memory_gib: float | None = Field(
        default=None, gt=0, description="device-reported capacity in GiB; None = hbm_gb converted from GB"
    )
    hbm_bw_tbs: float = Field(gt=0, description="HBM bandwidth, TB/s")
    intra_node_bw_gbs: float = Field(
        gt=0, description="per-GPU one-direction bandwidth to the other GPUs of its node (aggregate), GB/s"
    )
    intra_node_links: int = Field(default=7, ge=1, description="peers a GPU links to directly (mesh only)")
    intra_node_latency_us: float = Field(default=8.0, ge=0, description="fixed cost of an intra-node hop, us")
    inter_node_bw_gbs: float = Field(
        gt=0,
        description="one NIC's one-direction bandwidth, GB/s (the catalog's nodes have one NIC per GPU, so this "
        "is also a GPU's share of the network)",
    )
    nics_per_node: int | None = Field(
        default=None,
        ge=1,
        description="NICs per node (None = one per GPU): a GPU's network share is "
        "nics_per_node x inter_node_bw_gbs / gpus_per_node",
    )
    inter_node_latency_us: float = Field(
        default=20.0, ge=0, description="fixed cost of an inter-node hop, us"
    )
    topology: Literal["switch", "mesh"] = Field(
        description="intra-node fabric: NVSwitch-like (full bandwidth to any peer) or a full mesh of links"
    )
    gpus_per_host: int | None = Field(
        default=None,
        ge=1,
        description="GPUs one host (one operating system: a server or a rack's compute tray) holds where a node, "
        "the NVLink domain, spans several hosts; None = a node is one host. Launches start one process group "
        "per host (cluster.gpus_per_host)",
    )

    @property
    def hbm_gib(self) -> float:
        """Memory capacity in GiB (2^30 bytes): ``memory_gib``, else the datasheet GB converted."""
        return self.memory_gib if self.memory_gib is not None else self.hbm_gb * GB / GIB

    def peak_tflops(self, precision: str) -> float:
        """Dense peak for ``bf16``/``fp16``/``fp8``; FP8 falls back to BF16 when the GPU has none."""
        if precision == "fp8" and self.fp8_tflops is not None:
            return self.fp8_tflops
        return self.bf16_tflops

    @classmethod
    def catalog(cls, name: str) -> GPUSpec:
        """The catalog GPU ``name`` (case-insensitive: ``H100``, ``MI355X``)."""
        return GPU_CATALOG[gpu_key(name)]


def gpu_key(name: str) -> str:
    """The catalog key of a GPU name: GPU names are case-insensitive (``H200`` = ``h200``)."""
    return name.strip().lower()


def with_overrides(base: GPUSpec, overrides: dict[str, Any]) -> dict[str, Any]:
    """A catalog GPU's fields with a study file's ``overrides`` applied.

    ``hbm_gb`` without ``memory_gib`` changes the capacity too (e.g. ``{catalog: h100, hbm_gb: 94}`` for an
    H100 NVL): the catalog's device-reported ``memory_gib`` is scaled by the same ratio (80 GB → 79.6 GiB, so
    94 GB → 93.5 GiB, what ``nvidia-smi`` reports for the 94 GB part); without it the override was ignored."""
    data = {**base.model_dump(), **overrides}
    if "hbm_gb" in overrides and "memory_gib" not in overrides and base.memory_gib is not None:
        try:
            hbm = float(overrides["hbm_gb"])
        except (TypeError, ValueError):
            hbm = 0.0
        if hbm > 0:  # otherwise pydantic reports the bad hbm_gb value under its own name
            data["memory_gib"] = base.memory_gib * hbm / base.hbm_gb
    return data


# Datasheet figures (shared/reference/hardware.md). memory_gib: device-reported totals (nvidia-smi memory.total:
# A100-80GB 81920 MiB of which ~79.2 GiB allocatable, H100 81559 MiB, H200 143771 MiB, B200 183359 MiB;
# rocm-smi VRAM total: MI300X 192 GiB, MI325X 256 GiB, MI355X 288 GiB), rounded down. Latencies are typical fixed costs of one collective hop
# (NCCL/RCCL tests report ~5-10 us intra-node, ~15-30 us over RoCE/IB); they are overridable.
_NET_400G = 50.0  # 400 Gb/s NIC per GPU = 50 GB/s one direction
_NET_800G = 100.0  # 800 Gb/s (ConnectX-8) per GPU
GPU_CATALOG: dict[str, GPUSpec] = {
    "mi300x": GPUSpec(
        name="mi300x",
        vendor="amd",
        bf16_tflops=1307,
        fp8_tflops=2615,
        hbm_gb=192,
        memory_gib=191.9,
        hbm_bw_tbs=5.3,
        intra_node_bw_gbs=448,
        intra_node_links=7,
        inter_node_bw_gbs=_NET_400G,
        topology="mesh",
    ),
    "mi325x": GPUSpec(
        name="mi325x",
        vendor="amd",
        bf16_tflops=1307,
        fp8_tflops=2615,
        hbm_gb=256,
        memory_gib=255.9,
        hbm_bw_tbs=6.0,
        intra_node_bw_gbs=448,
        intra_node_links=7,
        inter_node_bw_gbs=_NET_400G,
        topology="mesh",
    ),
    "mi355x": GPUSpec(
        name="mi355x",
        vendor="amd",
        bf16_tflops=2500,
        fp8_tflops=5000,
        hbm_gb=288,
        memory_gib=287.9,
        hbm_bw_tbs=8.0,
        intra_node_bw_gbs=537.6,
        intra_node_links=7,
        inter_node_bw_gbs=_NET_400G,
        topology="mesh",
    ),
    "a100-80gb": GPUSpec(
        name="a100-80gb",
        vendor="nvidia",
        bf16_tflops=312,
        fp8_tflops=None,
        hbm_gb=80,
        memory_gib=79.2,
        hbm_bw_tbs=2.04,
        intra_node_bw_gbs=300,
        intra_node_links=7,
        inter_node_bw_gbs=25.0,
        topology="switch",
    ),
    "h100": GPUSpec(
        name="h100",
        vendor="nvidia",
        bf16_tflops=989,
        fp8_tflops=1979,
        hbm_gb=80,
        memory_gib=79.6,
        hbm_bw_tbs=3.35,
        intra_node_bw_gbs=450,
        intra_node_links=7,
        inter_node_bw_gbs=_NET_400G,
        topology="switch",
    ),
    "h200": GPUSpec(
        name="h200",
        vendor="nvidia",
        bf16_tflops=989,
        fp8_tflops=1979,
        hbm_gb=141,
        memory_gib=140.0,
        hbm_bw_tbs=4.8,
        intra_node_bw_gbs=450,
        intra_node_links=7,
        inter_node_bw_gbs=_NET_400G,
        topology="switch",
    ),
    "b200": GPUSpec(
        name="b200",
        vendor="nvidia",
        bf16_tflops=2250,
        fp8_tflops=4500,
        hbm_gb=180,
        memory_gib=179.0,
        hbm_bw_tbs=8.0,
        intra_node_bw_gbs=900,
        intra_node_links=7,
        inter_node_bw_gbs=_NET_400G,
        topology="switch",
    ),
    # Grace-Blackwell racks (NVL72): a "node" here is the NVLink domain the job uses (up to 72 GPUs; Megatron-
    # Bridge's published runs use 64 per domain), the network is one NIC per GPU. Figures from NVIDIA's GB200
    # NVL72 / GB300 NVL72 / HGX B300 specification tables (dense = the sparse figure / 2): GB200 360 PF BF16,
    # 720 PF FP8 sparse per 72 GPUs, 13.4 TB HBM3e (186 GB per GPU), 8 TB/s, NVLink5 1.8 TB/s both directions,
    # ConnectX-7 400 Gb/s; GB300 the same compute (180 / 360 PF dense per rack), 20.7 TB HBM3e (288 GB per GPU),
    # ConnectX-8 800 Gb/s; HGX B300 36 / 72 PF BF16 / FP8 sparse per 8 GPUs, 288 GB HBM3e, ConnectX-8. No
    # device-reported capacity is on record for them (memory_gib = the datasheet GB converted). A host is one
    # compute tray of the rack: 18 trays of two superchips, 4 GPUs (and 2 Grace CPUs) each (the same tables:
    # 72 GPUs, 36 Grace CPUs per rack), so a launch starts one process group per 4 GPUs.
    "gb200": GPUSpec(
        name="gb200",
        gpus_per_host=4,
        vendor="nvidia",
        bf16_tflops=2500,
        fp8_tflops=5000,
        hbm_gb=186,
        hbm_bw_tbs=8.0,
        intra_node_bw_gbs=900,
        intra_node_links=7,
        inter_node_bw_gbs=_NET_400G,
        topology="switch",
    ),
    "gb300": GPUSpec(
        name="gb300",
        gpus_per_host=4,
        vendor="nvidia",
        bf16_tflops=2500,
        fp8_tflops=5000,
        hbm_gb=288,
        hbm_bw_tbs=8.0,
        intra_node_bw_gbs=900,
        intra_node_links=7,
        inter_node_bw_gbs=_NET_800G,
        topology="switch",
    ),
    "b300": GPUSpec(
        name="b300",
        vendor="nvidia",
        bf16_tflops=2250,
        fp8_tflops=4500,
        hbm_gb=288,
        hbm_bw_tbs=8.0,
        intra_node_bw_gbs=900,
        intra_node_links=7,
        inter_node_bw_gbs=_NET_800G,
        topology="switch",
    ),
}

CATALOG_NODE: dict[str, tuple[int, int]] = {
    **{name: (8, 8) for name in ("mi300x", "mi325x", "mi355x", "a100-80gb", "h100", "h200", "b200", "b300")},
    "gb200": (64, 4),
    "gb300": (64, 4),
}
"""(GPUs per node, GPUs per host) of each catalog GPU's usual system: an 8-GPU HGX/DGX board or AMD platform
(shared/reference/hardware.md, "typical node"), whole hosts only; a GB200/GB300 NVL72 rack used as NVLink
domains of 64 GPUs (the domain Megatron-Bridge's published GB200/GB300 runs use; the catalog's comment above),
whose hosts are 4-GPU compute trays (NVIDIA GB200 NVL72 datasheet: 18 trays of 2 GB200 superchips, 72 GPUs), so
a job smaller than a domain runs on whole trays of one rack."""

MXFP8_GPUS = frozenset({"b200", "b300", "gb200", "gb300", "mi355x"})
"""Catalog GPUs with MX block-scaled FP8 in hardware (``workload.fp8_recipe: mxfp8``): NVIDIA Blackwell (SM 10.0;
Transformer Engine's MXFP8 user guide: "Hardware support for the MXFP8 ... first appeared in the Blackwell GPU")
and AMD CDNA 4 (MI355X datasheet: MXFP8/MXFP6/MXFP4). Hopper (H100/H200), A100 and CDNA 3 (MI300X/MI325X) have
per-tensor FP8 scaling at most."""


def catalog_node(name: str) -> tuple[int, int]:
    """(GPUs per node, GPUs per host) of catalog GPU ``name`` (:data:`CATALOG_NODE`; 8 and 8 otherwise)."""
    return CATALOG_NODE.get(gpu_key(name), (8, 8))
