"""The collective model against the measured figures that exist: vTrain's 8-GPU A100 all-reduce look-up
tables and DeepEP's published dispatch/combine bandwidths; then the model's NCCL-style bus bandwidths for
1-64 nodes of H100 and MI355X (what ``primus-optuna estimate --explain-comm`` prints for a study).

    python scripts/check_comm.py

References (quoted, with their source):
- VIA-Research/vTrain ``trace/a100/AR_GPU{n}_1M_1024M_LUT`` @f8dda84 (MIT): nccl-tests all-reduce on one
  node of 8 A100 SXM 80GB, time (us) and bus bandwidth (GB/s) by size;
- DeepEP README via shared/reference/validation.md (deepseek-ai/DeepEP docs/legacy.md@dd758ca:19-26): H800 +
  CX7 400 Gb/s, 4096 tokens, hidden 7168, top-4 node groups, top-8, FP8 dispatch and BF16 combine: intranode
  EP8 dispatch 153 / combine 158 GB/s (NVLink), internode EP16/32/64 dispatch 43/58/51, combine 43/57/50 GB/s
  (RDMA). These are DeepEP's logical bandwidths: its benchmark counts a rank's own copy and its own node
  (tests/legacy/test_intranode.py@dd758ca:188, test_internode.py@dd758ca:59-63,224).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from primus_optuna.physics.calibration import FAMILIES  # noqa: E402
from primus_optuna.physics.comm import (  # noqa: E402
    Group,
    Topology,
    bus_bandwidth_table,
    format_bus_bandwidth,
    hit_probability,
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
DEEPEP_H800 = {8: (153.0, 158.0), 16: (43.0, 43.0), 32: (58.0, 57.0), 64: (51.0, 50.0)}
"""DeepEP normal kernels' (dispatch, combine) bottleneck bandwidth (GB/s), DeepEP docs/legacy.md@dd758ca:21-26:
EP8 over NVLink, EP16/32/64 over RDMA, logical bytes (a rank's own copy and own node counted)"""
DEEPEP_FITTED = (8, 32)
"""the EP sizes the DeepEP efficiencies were fitted to (calibration.py); EP16 and EP64 are held back"""


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
    print(
        "\nDeepEP normal kernels (4096 tokens, hidden 7168, top-8 of 256 experts, FP8 dispatch, BF16 combine; "
        "internode: top-min(nodes, 4) node groups), logical GB/s as DeepEP counts it: model vs published (H800)"
    )
    print("| EP | part | model dispatch | published | model combine | published |")
    print("|---|---|---|---|---|---|")
    for ep, (pub_d, pub_c) in DEEPEP_H800.items():
        g = Group(ep, 1)
        nodes = ep // t.members_per_node(g)
        groups, group_topk = (nodes, min(nodes, 4)) if nodes > 1 else (None, None)
        model = []
        for token_bytes in (hidden * (1 + 4 / 128), hidden * 2):
            sec = t.deepep_dispatch(
                tokens,
                token_bytes,
                topk,
                experts,
                g,
                k.deepep_intra_eff,
                k.deepep_inter_eff,
                groups,
                group_topk,
            )
            if nodes == 1:  # bytes each rank receives, its own copy included (test_intranode.py:188)
                held = experts / ep
                logical = tokens * token_bytes * ep * hit_probability(experts, topk, held)
            else:  # once per destination node, its own included (test_internode.py:59-63, 224)
                held = experts / nodes
                logical = (
                    tokens * token_bytes * nodes * hit_probability(experts, topk, held, groups, group_topk)
                )
            model.append(logical / sec / GB)
        part = "fit" if ep in DEEPEP_FITTED else "held"
        print(f"| {ep} | {part} | {model[0]:.1f} | {pub_d:.0f} | {model[1]:.1f} | {pub_c:.0f} |")


def clusters() -> None:
    for name, fam in (("h100", "hopper"), ("mi355x", "cdna4")):
        gpu = GPU_CATALOG[name]
        k = FAMILIES[fam]
        t = Topology(gpu, 8, k.coll_eff, k.a2a_eff, k.a2a_inter_eff)
        print(f"\n{name}, 8 GPUs and 8 NICs per node:")
        print(format_bus_bandwidth(bus_bandwidth_table(t)))


def main() -> None:
    argparse.ArgumentParser(description=__doc__.split("\n\n")[0]).parse_args()
    vtrain()
    deepep()
    clusters()


if __name__ == "__main__":
    main()
