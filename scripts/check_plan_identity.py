"""Identity check for ``plan`` optimisations: no estimate may change.

For each study: over every legal configuration the sum and a SHA-256 of the peak memory
(:func:`estimate_memory`), over every fitting configuration the sum and a SHA-256 of tokens/s/GPU
(:func:`estimate_throughput`), each value rounded to 9 significant digits, in the space's order; plus the
same for the ranked :func:`plan_space` result (config, tokens/s/GPU, peak). ``--save FILE`` writes the
figures as JSON, ``--against FILE`` compares with a saved run and exits 1 on any difference.

python scripts/check_plan_identity.py --save /tmp/before.json
python scripts/check_plan_identity.py --against /tmp/before.json
python scripts/check_plan_identity.py --sims studies/*.yaml   # every simulation of these plans, against the
                                                               # verbatim reference simulation (exact equality)
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
import time
from pathlib import Path

from primus_optuna.physics.memory import estimate_memory
from primus_optuna.physics.plan import plan_space
from primus_optuna.physics.throughput import estimate_throughput
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec

ROOT = Path(__file__).resolve().parents[1]
STUDIES = (
    "studies/mixtral-8x22b-mi355x-fp8.yaml",
    "studies/deepseek-v3-mi355x-fp8.yaml",
    "studies/gpt-oss-120b-h100-bf16.yaml",
)


def _r(x: float) -> str:
    return f"{x:.9g}"


def figures(path: str) -> dict[str, object]:
    spec = StudySpec.from_yaml(ROOT / path)
    space = Space(spec)
    configs = space.configs()
    mem_h, tps_h = hashlib.sha256(), hashlib.sha256()
    mem_sum = tps_sum = 0.0
    fit = 0
    for c in configs:
        mem = estimate_memory(spec, c)
        mem_sum += mem.peak_gib
        mem_h.update(_r(mem.peak_gib).encode() + b";")
        if mem.fits:
            fit += 1
            tps = estimate_throughput(spec, c).tokens_per_s_per_gpu
            tps_sum += tps
            tps_h.update(_r(tps).encode() + b";")
    # the plan itself, on a fresh spec (cold per-spec caches)
    spec2 = StudySpec.from_yaml(ROOT / path)
    res = plan_space(spec2, Space(spec2), top=5)
    plan_h = hashlib.sha256()
    for e in res.ranked:
        plan_h.update(
            f"{sorted(e.config.to_params().items())}|{_r(e.tokens_per_s_per_gpu)}|{_r(e.peak_gib)};".encode()
        )
    base = res.baseline
    return {
        "legal": len(configs),
        "fit": fit,
        "peak_gib_sum": _r(mem_sum),
        "peak_gib_sha256": mem_h.hexdigest(),
        "tps_sum": _r(tps_sum),
        "tps_sha256": tps_h.hexdigest(),
        "plan_ranked_sha256": plan_h.hexdigest(),
        "plan_legal_fit": [res.legal_configs, res.feasible_configs],
        "baseline": None if base is None else [_r(base.tokens_per_s_per_gpu), _r(base.peak_gib)],
        "baseline_ranks": [res.baseline_rank, res.baseline_throughput_rank],
        "pareto": len(res.pareto),
    }


def check_sims(paths: list[str]) -> bool:
    """Plan each study recording every pipeline simulation it asks for, then run each through
    :func:`pipeline.simulate` and its straightforward reference (Megatron's fixed order for 1F1B and
    interleaved, the verbatim greedy simulation for the zero-bubble schedules) with each chunk's quantised
    durations: makespan, busy times and sends must be equal. Also counts the 1F1B / interleaved simulations whose
    result the greedy simulation (what they were before they followed Megatron's order) would change."""
    from primus_optuna.physics import pipeline
    from tests.physics.pipeline_reference import simulate_reference, static_reference

    keys: set[tuple] = set()
    memo = pipeline._normalised

    def record(*key: object) -> tuple:
        keys.add(key)
        return memo(*key)

    pipeline._normalised = record  # type: ignore[assignment]
    try:
        for path in paths:
            spec = StudySpec.from_yaml(ROOT / path)
            plan_space(spec, Space(spec))
    finally:
        pipeline._normalised = memo
    bad = greedy_differs = 0
    t_ref = t_new = 0.0
    for mix, key in sorted(keys, key=lambda k: (id(k[0]), k[1])):
        m, qc = key[0], key[1]
        durations = pipeline.quantised_chunks(mix, key[2::3], key[3::3], key[4::3])
        c = qc / pipeline._RES
        args = (mix.schedule, mix.pp, mix.vpp, m, 0.0, 0.0, 0.0, c)
        t0 = time.process_time()
        fixed = mix.schedule in ("1f1b", "interleaved")
        ref = (static_reference if fixed else simulate_reference)(*args, per_chunk=durations)
        t1 = time.process_time()
        makespan, busy, sends, _ = pipeline.simulate_chunks(mix.schedule, mix.pp, mix.vpp, m, *durations, c)
        t2 = time.process_time()
        t_ref, t_new = t_ref + t1 - t0, t_new + t2 - t1
        if (makespan, busy, sends) != tuple(ref[:3]):
            bad += 1
            print(f"DIFFERENT simulation {mix.schedule} pp={mix.pp} v={mix.vpp} m={m} {mix.counts}")
        if fixed and tuple(simulate_reference(*args, per_chunk=durations)[:3]) != tuple(ref[:3]):
            greedy_differs += 1
    print(
        f"simulations: {len(keys)} of {len(paths)} studies, {len(keys) - bad} equal to the reference; "
        f"CPU s reference {t_ref:.2f}, simulate {t_new:.2f}; {greedy_differs} 1F1B / interleaved results "
        "the greedy order would change"
    )
    return bad == 0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("studies", nargs="*", default=list(STUDIES))
    ap.add_argument("--save")
    ap.add_argument("--against")
    ap.add_argument(
        "--sims", action="store_true", help="check every pipeline simulation of the plans instead"
    )
    args = ap.parse_args()
    if args.sims:
        sys.exit(0 if check_sims(args.studies) else 1)
    out = {}
    for path in args.studies:
        out[path] = figures(path)
        f = out[path]
        print(
            f"{path}: legal {f['legal']} fit {f['fit']} peak sum {f['peak_gib_sum']} "
            f"{str(f['peak_gib_sha256'])[:12]} tps sum {f['tps_sum']} {str(f['tps_sha256'])[:12]} "
            f"plan {str(f['plan_ranked_sha256'])[:12]}"
        )
    if args.save:
        Path(args.save).write_text(json.dumps(out, indent=1))
    if args.against:
        ref = json.loads(Path(args.against).read_text())
        bad = [(p, k) for p in out for k in out[p] if ref.get(p, {}).get(k) != out[p][k]]
        for p, k in bad:
            print(f"DIFFERENT {p} {k}: {ref.get(p, {}).get(k)} -> {out[p][k]}")
        print("identity: " + ("HELD" if not bad else "BROKEN"))
        sys.exit(1 if bad else 0)


if __name__ == "__main__":
    main()
