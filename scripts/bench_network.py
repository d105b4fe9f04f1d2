"""Benchmark: ``plan`` of the flagship with the catalog's collectives and with a measured network file.

The network file is synthetic, written to a temporary directory: the catalog's own bus bandwidth of every
collective (all five) over 1-8 nodes of 8 ranks and over 2-8 nodes of 1 rank per node, at 1 KiB - 4 GiB
(factor 4), times ``--factor`` (0.5: a network half as fast as the catalog). Each repeat loads the study afresh
(cold per-spec caches: the tables are built once per spec) and runs :func:`plan_space`; the median CPU time
of the repeats after the first is reported, with the best configuration under each.

python scripts/bench_network.py [--repeat 5] [--factor 0.5]
"""

from __future__ import annotations

import argparse
import statistics
import tempfile
import time
from pathlib import Path

import yaml

from primus_optuna.physics.comm import Group
from primus_optuna.physics.network import study_topology
from primus_optuna.physics.plan import plan_space
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec
from primus_optuna.spec.network import COLLECTIVES, bus_factor

ROOT = Path(__file__).resolve().parents[1]
FLAGSHIP = ROOT / "studies" / "mixtral-8x22b-mi355x-fp8.yaml"


def synthetic_csv(spec: StudySpec, factor: float) -> str:
    """The catalog's bus bandwidths of ``spec``'s cluster times ``factor``, as a network CSV."""
    topo = study_topology(spec)
    gpn = spec.cluster.gpus_per_node
    lines = ["collective,ranks,ranks_per_node,bytes,busbw_gbs"]
    for per_node, nodes in [(gpn, n) for n in (1, 2, 4, 8)] + [(1, n) for n in (2, 4, 8)]:
        g = Group(per_node * nodes, max(1, gpn // per_node))
        for coll in COLLECTIVES:
            model = topo.catalog_model(coll)
            for k in range(5, 17):
                nbytes = 4**k
                t = model(nbytes, g)
                busbw = nbytes * bus_factor(coll, g.size) / t / 1e9 * factor
                lines.append(f"{coll},{g.size},{per_node},{nbytes},{busbw:.4f}")
    return "\n".join(lines) + "\n"


def timed(path: Path, repeat: int) -> tuple[float, str]:
    times, best = [], ""
    for _ in range(repeat):
        spec = StudySpec.from_yaml(path)
        t0 = time.process_time()
        result = plan_space(spec, Space(spec), top=1)
        times.append(time.process_time() - t0)
        best = f"{result.top[0].config.key()} {result.top[0].tokens_per_s_per_gpu:,.0f} tok/s/GPU"
    return statistics.median(times[1:] or times), best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--repeat", type=int, default=5)
    ap.add_argument("--factor", type=float, default=0.5)
    args = ap.parse_args()
    spec = StudySpec.from_yaml(FLAGSHIP)
    with tempfile.TemporaryDirectory() as tmp:
        net = Path(tmp) / "network.csv"
        net.write_text(synthetic_csv(spec, args.factor))
        data = yaml.safe_load(FLAGSHIP.read_text())
        data["cluster"]["network"] = str(net)
        measured = Path(tmp) / "study.yaml"
        measured.write_text(yaml.safe_dump(data))
        legal = len(Space(spec).configs())
        print(f"{spec.name}: {legal} legal configurations, {args.repeat} repeats (median after the first)")
        for label, path in (("catalog", FLAGSHIP), (f"network x{args.factor:g}", measured)):
            median, best = timed(path, args.repeat)
            print(f"{label:<14} plan {median:6.2f} s CPU   best {best}")


if __name__ == "__main__":
    main()
