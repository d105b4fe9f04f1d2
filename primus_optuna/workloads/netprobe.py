"""The cluster's collectives measured across its nodes (``primus-optuna calibrate --network``), written as the
network CSV that ``cluster.network`` reads (:data:`~primus_optuna.spec.network.CSV_COLUMNS`).

Run under torchrun on every host (``RANK``, ``WORLD_SIZE``, ``LOCAL_WORLD_SIZE`` from its environment; rank
``r`` is on node ``r // ranks_per_node``, as torchrun numbers the ranks of a static rendezvous)::

    torchrun --nnodes 4 --nproc-per-node 8 --node-rank R --master-addr HOST0 --master-port 29500 \\
        -m primus_optuna.workloads.netprobe --out net.csv --budget-s 120

It measures every collective of :data:`~primus_optuna.spec.network.COLLECTIVES` over message sizes in each
group scope the collective model prices (:func:`scopes`): the first 2, 4, 8, ... nodes with all their ranks
(tensor/expert groups that span nodes, the whole world last) and with one rank per node (data-parallel groups
across nodes); send/receive between two nodes. The timing is
:func:`~primus_optuna.workloads.microbench.measure_collectives` (nccl-tests' byte counts and bus-bandwidth
factors); the budget is shared evenly by the scopes. Rank 0 writes the CSV (whole, at the end).
"""

from __future__ import annotations

import argparse
import csv
import io
import math
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path

from ..errors import SpecError
from ..spec.network import COLLECTIVES, CSV_COLUMNS, Row, parse_csv
from ..spec.study import StudySpec
from .calibrate import COLLECTIVE_SIZES

Scope = tuple[list[int], int]
"""(the global ranks of a group, how many of them share a node)"""


def scopes(nodes: int, per_node: int) -> list[Scope]:
    """The groups measured on ``nodes`` nodes of ``per_node`` ranks: for k = 2, 4, 8, ... nodes and all of
    them, the first k nodes with all their ranks, then with one rank (the first) per node."""
    counts = sorted({*(2**i for i in range(1, nodes.bit_length()) if 2**i < nodes), nodes} - {1})
    out: list[Scope] = []
    for k in counts:
        out.append((list(range(k * per_node)), per_node))
        if per_node > 1:
            out.append(([n * per_node for n in range(k)], 1))
    return out


def csv_text(rows: list[tuple[str, int, int, int, float]]) -> str:
    """The network CSV: a header line, one row per (collective, ranks, ranks per node, bytes, GB/s)."""
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(CSV_COLUMNS)
    for coll, ranks, per_node, nbytes, busbw in rows:
        w.writerow([coll, ranks, per_node, nbytes, f"{busbw:.6g}"])
    return buf.getvalue()


def probe(
    out: Path, budget_s: float, device: str, per_node: int, sizes: list[int] | None = None
) -> list[tuple[str, int, int, int, float]] | None:
    """Measure every scope on this rank (all ranks call it); rank 0 writes ``out`` and returns the rows."""
    import torch
    import torch.distributed as dist

    from .microbench import measure_collectives

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if world % per_node:
        raise SystemExit(f"netprobe: {world} ranks do not fill nodes of {per_node} (--ranks-per-node)")
    if device == "cuda":
        local = int(os.environ.get("LOCAL_RANK", "0"))
        torch.cuda.set_device(local)
        dev, backend = torch.device("cuda", local), "nccl"
    else:
        dev, backend = torch.device("cpu"), "gloo"
    dist.init_process_group(backend)
    end = time.perf_counter() + budget_s
    todo = scopes(world // per_node, per_node)
    rows: list[tuple[str, int, int, int, float]] = []
    try:
        for i, (members, k) in enumerate(todo):
            group = dist.new_group(members)  # every rank creates every group, in the same order
            ops = [c for c in COLLECTIVES if c != "send_recv" or (k == 1 and len(members) == 2)]
            if rank in members:
                deadline = time.perf_counter() + max(0.0, end - time.perf_counter()) / (len(todo) - i)
                points, _ = measure_collectives(
                    ops, sizes or COLLECTIVE_SIZES[device], dev, backend, deadline, group
                )
                rows += [(p["op"], p["ranks"], k, p["bytes"], p["busbw_gbs"]) for p in points]
            dist.barrier()
        if rank == 0:
            out.parent.mkdir(parents=True, exist_ok=True)
            tmp = out.with_name(out.name + ".part")
            tmp.write_text(csv_text(rows))
            tmp.replace(out)
        dist.barrier()
    finally:
        dist.destroy_process_group()
    return rows if rank == 0 else None


PROBE = "primus_optuna.workloads.netprobe"
STARTUP_S = 120.0
"""what the launch may take beyond the budget (process start-up on every host, the rendezvous, NCCL's setup)"""


def check_network_request(
    budget_s: float, local_ranks: int | None, study: StudySpec | None, device: str = "auto"
) -> None:
    """Refuse a bad ``calibrate --network`` before anything is launched (a :class:`SpecError` naming the
    option); ``--local-ranks`` on GPUs needs one GPU per rank here (the hosts' GPUs are their own)."""
    if device not in ("auto", "cpu", "cuda"):
        raise SpecError(f"--device {device!r}: choose cpu or cuda")
    if not budget_s > 0 or math.isinf(budget_s):
        raise SpecError(f"--budget-s {budget_s!r}: give a positive number of seconds (e.g. 120)")
    if local_ranks is not None and local_ranks < 2:
        raise SpecError(f"--local-ranks {local_ranks}: give at least 2 (each process is one node of 1 rank)")
    if local_ranks is None and study is None:
        raise SpecError(
            "--study: calibrate --network launches through a study's runner (Slurm or runner.options.hosts); "
            "give --study, or --local-ranks N to measure N processes of this machine"
        )
    if local_ranks is None and study is not None and study.cluster.nodes < 2:
        raise SpecError(
            "cluster.nodes: the study has 1 node, so there is nothing between nodes to measure; set cluster.nodes "
            "to the nodes to measure between (the node's own collectives: calibrate --out PROFILE.yaml)"
        )
    if local_ranks is not None and device == "cuda":
        from .calibrate import check_request

        check_request(device, budget_s, local_ranks)


def measure_network(
    out: str | Path,
    budget_s: float = 120.0,
    device: str = "auto",
    study: StudySpec | None = None,
    local_ranks: int | None = None,
) -> list[Row]:
    """Launch the probe across the study's hosts through its runner (or ``local_ranks`` processes here, each a
    node of 1 rank), wait, and write its CSV to ``out`` (whole, or nothing on a failure or an interrupt);
    returns the rows as :func:`~primus_optuna.spec.network.parse_csv` reads them."""
    from ..run.base import RunFailure
    from ..run.command import Launch, run_launch
    from ..run.logparse import tail
    from ..run.presets import module_launch

    check_network_request(budget_s, local_ranks, study, device)
    out = Path(out)
    work = Path(tempfile.mkdtemp(prefix=f".{out.name}.netprobe-", dir=out.parent))
    try:
        result = (work / "network.csv").resolve()
        args = [PROBE, "--out", str(result), "--budget-s", f"{budget_s:g}", "--device", device]
        if local_ranks is not None:
            threads = str(max(1, (os.cpu_count() or 1) // local_ranks))
            torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nnodes", "1"]
            argv = [*torchrun, "--nproc-per-node", str(local_ranks), "-m", *args, "--ranks-per-node", "1"]
            launch = Launch(argv=argv, env={"OMP_NUM_THREADS": threads, "MKL_NUM_THREADS": threads})
        else:
            assert study is not None
            args += ["--ranks-per-node", str(study.cluster.gpus_per_node)]
            launch = module_launch(
                study, study.runner.kind, study.runner.options, args, work, {}, budget_s + STARTUP_S
            )
        log = work / "netprobe.log"
        rc = run_launch(launch, log, budget_s + STARTUP_S)
        if rc != 0 or not result.is_file():
            text = log.read_text(errors="replace")
            raise RunFailure(f"the probe exited with code {rc}:\n{tail(text)}", log_tail=tail(text))
        text = result.read_text()
        rows = parse_csv(text, out)
        part = out.with_name(out.name + ".part")
        part.write_text(text)
        part.replace(out)
        return rows
    finally:
        shutil.rmtree(work, ignore_errors=True)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m primus_optuna.workloads.netprobe", description=__doc__)
    ap.add_argument("--out", required=True, type=Path, help="the network CSV rank 0 writes")
    ap.add_argument("--budget-s", type=float, default=120.0, help="seconds to spend measuring")
    ap.add_argument("--device", choices=("auto", "cpu", "cuda"), default="auto")
    ap.add_argument(
        "--ranks-per-node",
        type=int,
        default=None,
        help="ranks that share a node (default LOCAL_WORLD_SIZE; 1 makes every rank a node)",
    )
    ap.add_argument(
        "--sizes", type=int, nargs="+", default=None, help="message bytes (default: calibrate's per device)"
    )
    args = ap.parse_args(argv)
    device = args.device
    if device == "auto":
        import torch

        device = "cuda" if torch.cuda.is_available() else "cpu"
    per_node = args.ranks_per_node or int(os.environ.get("LOCAL_WORLD_SIZE", "1"))
    probe(args.out, args.budget_s, device, per_node, args.sizes)


if __name__ == "__main__":
    main()
