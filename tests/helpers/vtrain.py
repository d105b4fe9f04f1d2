"""The vTrain A100 single-node measurements (tests/data/vtrain-a100-single-node.csv) as study specs + configs.

Megatron-DeepSpeed as vTrain ran it (vTrain ``config/validation/single/*.json``, shared/reference/data/
README.md): GPT (GeLU 4h MLP, LayerNorm, learned positions, vocab 51200), fp16, unfused attention, no
distributed optimizer, full activation checkpointing (``use_checkpoint``: recompute ``full``), no gradient
bucketing (one fp16 gradient all-reduce after the last backward: ``overlap_grad_reduce: false``, 2-byte
gradients), the 1F1B schedule and no sequence parallelism. A *group* is one model (hidden, layers) and global batch: the configurations a search compares.
"""

from __future__ import annotations

import csv
import random
from dataclasses import dataclass
from pathlib import Path

from primus_optuna.space import TrainingConfig
from primus_optuna.spec import StudySpec
from tests.helpers.models import gpt_model

CSV = Path(__file__).resolve().parents[1] / "data" / "vtrain-a100-single-node.csv"
SEQ = 1024


@dataclass(frozen=True)
class Row:
    group: tuple[int, int, int]
    """(hidden, layers, global batch)"""
    gpus: int
    spec: StudySpec
    config: TrainingConfig
    measured_s: float

    @property
    def measured_tps(self) -> float:
        """measured tokens/s/GPU"""
        return self.group[2] * SEQ / self.measured_s / self.gpus


def load_rows() -> list[Row]:
    specs: dict[tuple[int, ...], StudySpec] = {}
    out = []
    with CSV.open() as fh:
        for r in csv.DictReader(fh):
            g, gbs = int(r["# GPUs"]), int(r["global batch"])
            h, layers, heads = int(r["hidden size"]), int(r["# layers"]), int(r["attention heads"])
            key = (h, layers, heads, gbs, g)
            if key not in specs:
                specs[key] = StudySpec.from_dict(
                    {
                        "name": "vtrain",
                        "model": gpt_model(h, layers, heads),
                        "cluster": {"gpu": "a100-80gb", "nodes": 1, "gpus_per_node": g},
                        "workload": {
                            "seq_length": SEQ,
                            "global_batch_size": gbs,
                            "precision": "fp16",
                            "distributed_optimizer": False,
                            "flash_attention": False,
                            "overlap_grad_reduce": False,
                            "grad_reduce_in_fp32": False,
                            "sequence_parallel": False,
                        },
                    }
                )
            c = TrainingConfig(
                tp=int(r["tensor parallelism"]),
                pp=int(r["pipeline parallelism"]),
                mbs=int(r["micro batch"]),
                recompute="full",
            ).derive(g, gbs)
            out.append(Row((h, layers, gbs), g, specs[key], c, float(r["iteration time (ms)"]) / 1000))
    return out


def split_groups(rows: list[Row], seed: int = 0) -> tuple[set, set]:
    """A random half of the groups (fit) and the other half (held back)."""
    groups = sorted({r.group for r in rows})
    rng = random.Random(seed)
    rng.shuffle(groups)
    half = len(groups) // 2
    return set(groups[:half]), set(groups[half:])
