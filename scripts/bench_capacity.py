"""Benchmark: ``capacity`` (the best configuration of every GPU type at every size: a whole ``plan`` per cell).

Goal: a 10-size x 3-GPU-type table in < 10 s on this machine (2 cores). Each repeat loads the study afresh
(cold per-spec caches; the per-process pipeline-schedule and memory tables are cleared too), times
:func:`capacity_table` by the wall clock and the process's CPU time (the CPU time is what the machine's load
does not change), and prints the median, then the table of the last repeat.

python scripts/bench_capacity.py [--study studies/llama3.1-70b-h100-bf16.yaml] [--gpus 8,16,...,4096]
    [--gpu h100,h200,mi355x] [--batch fixed] [--repeat 3]
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from primus_optuna.cli.capacity_cmd import parse_sizes, render
from primus_optuna.physics import memory, pipeline
from primus_optuna.physics.capacity import capacity_table
from primus_optuna.spec import StudySpec

ROOT = Path(__file__).resolve().parents[1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--study", default=str(ROOT / "studies" / "llama3.1-70b-h100-bf16.yaml"))
    ap.add_argument("--gpus", default="8,16,32,...,4096")
    ap.add_argument("--gpu", default="h100,h200,mi355x")
    ap.add_argument("--batch", default="fixed")
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    sizes, types = parse_sizes(args.gpus), args.gpu.split(",")
    walls, cpus = [], []
    table = None
    for _ in range(args.repeat):
        pipeline._normalised.cache_clear()
        pipeline.chunk_mix.cache_clear()
        pipeline._shape.cache_clear()
        pipeline._bound_terms.cache_clear()
        memory._TABLES.clear()
        spec = StudySpec.from_yaml(args.study)
        t0, c0 = time.perf_counter(), time.process_time()
        table = capacity_table(spec, sizes, types, tokens=1e12, days=30, batch=args.batch)
        walls.append(time.perf_counter() - t0)
        cpus.append(time.process_time() - c0)
    assert table is not None
    cells = len(table.all_rows)
    print(render(table))
    print(
        f"\n{Path(args.study).name}: {len(sizes)} sizes x {len(types)} GPU types ({cells} cells, --batch "
        f"{args.batch}): median wall {statistics.median(walls):.2f} s, median CPU {statistics.median(cpus):.2f} s "
        f"(walls {', '.join(f'{w:.2f}' for w in walls)})"
    )


if __name__ == "__main__":
    main()
