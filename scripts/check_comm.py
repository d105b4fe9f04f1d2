"""The collective model against the measured figures that exist: vTrain's 8-GPU A100 all-reduce look-up
tables and DeepEP's published dispatch/combine bandwidths; then the model's NCCL-style bus bandwidths for
1-64 nodes of H100 and MI355X (what ``primus-optuna estimate --explain-comm`` prints for a study).

    python scripts/check_comm.py

References (quoted, with their source):
- VIA-Research/vTrain ``trace/a100/AR_GPU{n}_1M_1024M_LUT`` @f8dda84 (MIT): nccl-tests all-reduce on one
  node of 8 A100 SXM 80GB, time (us) and bus bandwidth (GB/s) by size;
- DeepEP README via shared/reference/validation.md: H800 + CX7 400 Gb/s, 4096 tokens, hidden 7168, top-8:
  intranode EP8 dispatch 153 / combine 158 GB/s (NVLink), internode EP16/32/64 dispatch 43/58/51 GB/s
  (RDMA).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_optuna.physics.calibration import FAMILIES  # noqa: E402
from primus_optuna.physics.comm import (  # noqa: E402
    Group,
    Topology,
    _miss,
    bus_bandwidth_table,
    format_bus_bandwidth,
)
from primus_optuna.spec import GB, GPU_CATALOG  # noqa: E402

# (GPUs, size MiB) -> (time us, busbw GB/s), first measurement column of the LUT files
VTRAIN_A100_AR = {
    (2, 1): (44.21, 23.72),
    (2, 16): (131.9, 127.16),
    (2, 256): (1455.8, 184.39),
    (2, 1024): (5442.8, 197.28),
    (4, 1): (51.4, 30.60),
    (4, 16): (179.6, 140.11),
    (4, 256): (1929.0, 208.73),
    (4, 1024): (7259.4, 221.86),
    (8, 1): (92.79, 19.78),
    (8, 16): (232.4, 126.33),
    (8, 256): (2162.3, 217.25),
    (8, 1024): (8193.0, 229.35),
}
DEEPEP_H800 = {8: 153.0, 16: 43.0, 32: 58.0, 64: 51.0}
"""DeepEP normal-kernel dispatch bandwidth (GB/s): EP8 over NVLink, EP16/32/64 over RDMA"""


def vtrain() -> None:
    a100 = GPU_CATALOG["a100-80gb"]
    t = Topology(a100, 8, FAMILIES["ampere"].coll_eff)
    print("A100 all-reduce, one node: model vs vTrain LUT")
    print("| GPUs | size | model us | LUT us | model busbw GB/s | LUT busbw GB/s |")
    print("|---|---|---|---|---|---|")
    for (n, mib), (us, bw) in VTRAIN_A100_AR.items():
        size = mib * 2**20
        sec = t.all_reduce(size, Group(n, 1))
        busbw = size / sec * 2 * (n - 1) / n / GB
        print(f"| {n} | {mib} MiB | {sec * 1e6:,.1f} | {us:,.1f} | {busbw:.1f} | {bw:.1f} |")


def deepep() -> None:
    h100 = GPU_CATALOG["h100"]  # H800: H100 silicon with 400 GB/s NVLink; CX7 400 Gb/s as the catalog's NIC
    h800 = h100.model_copy(update={"name": "h800", "intra_node_bw_gbs": 200.0})
    k = FAMILIES["hopper"]
    t = Topology(h800, 8, k.coll_eff, k.a2a_eff, k.a2a_inter_eff)
    tokens, hidden, topk, experts = 4096, 7168, 8, 256
    print("\nDeepEP dispatch (4096 tokens, hidden 7168, top-8, 256 experts, bf16): model vs published (H800)")
    print("| EP | model GB/s (bottleneck bytes / time) | published GB/s |")
    print("|---|---|---|")
    for ep, pub in DEEPEP_H800.items():
        g = Group(ep, 1)
        sec = t.deepep_dispatch(tokens, hidden * 2, topk, experts, g, k.deepep_intra_eff, k.deepep_inter_eff)
        kk = t.members_per_node(g)
        if ep <= 8:  # NVLink bytes to the other ranks holding a chosen expert
            nbytes = tokens * hidden * 2 * (kk - 1) * (1 - _miss(experts, experts / ep, topk))
        else:  # RDMA bytes to the other nodes holding a chosen expert
            nbytes = tokens * hidden * 2 * (ep // kk - 1) * (1 - _miss(experts, experts / ep * kk, topk))
        print(f"| {ep} | {nbytes / sec / GB:.1f} | {pub:.0f} |")


def clusters() -> None:
    for name, fam in (("h100", "hopper"), ("mi355x", "cdna4")):
        gpu = GPU_CATALOG[name]
        k = FAMILIES[fam]
        t = Topology(gpu, 8, k.coll_eff, k.a2a_eff, k.a2a_inter_eff)
        print(f"\n{name}, 8 GPUs and 8 NICs per node:")
        print(format_bus_bandwidth(bus_bandwidth_table(t)))


if __name__ == "__main__":
    vtrain()
    deepep()
    clusters()
