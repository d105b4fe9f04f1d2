"""The LLM planner against any OpenAI-compatible endpoint, and the model-guided fallback alone on the same budget.

    python scripts/bench_planner.py --api-base http://127.0.0.1:8080/v1 --model openai/NAME
    python scripts/bench_planner.py --model anthropic/claude-sonnet-4-5   # hosted: its key from the environment
        [--study studies/qwen3-30b-a3b-h200-bf16.yaml] [--trials 30] [--seed 0] [--mode agent|oneshot]
        [--max-calls 6] [--timeout 120] [--api-key-env VAR] [--json OUT.json]
    python scripts/bench_planner.py --loopback      # the loopback test server's scripted ranking agent

Both runs face the same hidden landscape (``bench_search.HiddenObjective``, seeded: the step-time model's
tokens/s/GPU times per-axis, pairwise and one cross-axis synergy factor the sampler cannot read), measured by
``bench_search.HiddenRunner`` through the library's own objective, so the planner's tools see measurements
that differ from the model as a real cluster's would. Same study, seed and trial budget for both.

Reported: per planner call its wall time, requests, tool calls, tokens, candidates accepted and rejected;
the totals of :func:`~primus_optuna.search.llm_budget.llm_accounting` (calls, failed, unparseable, tokens,
cost, why it stopped); rejections by reason; the best value reached by each run and its fraction of the
true optimum (the best legal configuration that fits, enumerated).

``--loopback`` starts ``tests/helpers/openai_server.py`` with :func:`ranking_agent`: it calls
``top_untried`` and submits what it answers. That exercises the whole agent path over HTTP (tools, native
tool calls, accounting), not a language model's judgement: a real model's figure needs an endpoint.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import tempfile
import time
from collections import Counter
from pathlib import Path
from typing import Any

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")
ROOT = Path(__file__).resolve().parents[1]
sys.path[:0] = [str(ROOT), str(ROOT / "scripts")]

import optuna  # noqa: E402
from bench_search import HiddenObjective, HiddenRunner  # noqa: E402

from primus_optuna import Space, StudySpec  # noqa: E402
from primus_optuna.errors import SpecError  # noqa: E402
from primus_optuna.physics.memory import estimate_memory  # noqa: E402
from primus_optuna.physics.throughput import estimate_throughput  # noqa: E402
from primus_optuna.record.storage import open_study  # noqa: E402
from primus_optuna.run.base import RunFailure  # noqa: E402
from primus_optuna.run.objective import make_objective  # noqa: E402
from primus_optuna.search.attrs import EXPECTED_SHARE  # noqa: E402
from primus_optuna.search.llm_budget import llm_accounting  # noqa: E402
from primus_optuna.search.pruner import MemoryPrefilterPruner  # noqa: E402
from primus_optuna.search.sampler import PrimusSampler  # noqa: E402

DEFAULT_STUDY = "studies/qwen3-30b-a3b-h200-bf16.yaml"


def optimum(spec: StudySpec, hidden: HiddenObjective) -> float:
    space = Space(spec)
    return max(
        hidden.value(c, estimate_throughput(spec, c).tokens_per_s_per_gpu)
        for c in space.configs()
        if estimate_memory(spec, c).fits
    )


def run_once(
    spec: StudySpec,
    hidden: HiddenObjective,
    trials: int,
    seed: int,
    workdir: Path,
    *,
    llm: Any,
    api_base: str | None,
) -> dict[str, Any]:
    handle = open_study(spec, storage=f"sqlite:///{workdir / 'study.db'}", pruner=MemoryPrefilterPruner())
    study = handle.study
    study.sampler = PrimusSampler(
        spec,
        seed=seed,
        llm=llm,
        llm_api_base=api_base,
        proposals_per_round=spec.llm.proposals_per_round,
        artifact_store=handle.artifact_store,
    )
    objective = make_objective(
        spec, HiddenRunner(hidden), space=study.sampler.space, runs_dir=handle.runs_dir
    )
    t0 = time.perf_counter()
    study.optimize(objective, n_trials=trials, catch=(RunFailure,))
    wall = time.perf_counter() - t0
    done = [t for t in study.trials if t.state == optuna.trial.TrialState.COMPLETE and t.values]
    best = max((t.values[0] for t in done), default=0.0)
    docs = []
    for p in handle.artifact_dir.rglob("*"):
        if p.is_file():
            try:
                d = json.loads(p.read_text())
            except (ValueError, UnicodeDecodeError):
                continue
            if isinstance(d, dict) and d.get("kind") == "primus-optuna planner transcript":
                docs.append(d)
    docs.sort(key=lambda d: d.get("trial_number") or 0)
    phases = Counter(str(t.user_attrs.get("phase")) for t in study.trials)
    best_phase = max(done, key=lambda t: t.values[0]).user_attrs.get("phase") if done else None
    return {
        "best": best,
        "wall_s": wall,
        "phases": dict(phases),
        "best_phase": best_phase,
        "books": llm_accounting(study),
        "calls": [
            {
                "trial": d.get("trial_number"),
                "mode": d.get("mode"),
                "wall_s": d.get("elapsed_s"),
                "requests": d.get("requests"),
                "tool_calls": len(d.get("tool_calls") or []),
                "tokens": d.get("tokens"),
                "accepted": len(d.get("accepted") or []),
                "rejected": len(d.get("rejected") or []),
                "error": (d.get("error") or "")[:120] or None,
            }
            for d in docs
        ],
        "rejected_by_reason": dict(
            Counter(str(r.get("reason", "")).split(":", 1)[0] for d in docs for r in d.get("rejected") or [])
        ),
    }


# --- comparison: the planner's modes against the fallback alone, TPE, CMA-ES and a hybrid ------------------
COMPARE = ("fallback", "rank", "oneshot", "agent", "bad-model", "tpe", "cmaes", "sweep+tpe")
"""``fallback``: PrimusSampler without an LLM; ``rank`` / ``oneshot`` / ``agent``: PrimusSampler with the
planner in that mode against the loopback server's scripted model (rank: the shortlist in order; one-shot: the
corrected ranking's top; agent: ``top_untried`` then submit), or the model of ``--model`` (hosted, or on the
server of ``--api-base``) when either is given;
``bad-model``: a scripted model that proposes the model's worst feasible configurations (what the gate
keeps out); ``tpe`` / ``cmaes``: Optuna's samplers through ``suggest_config`` (CMA-ES samples categorical
axes independently); ``sweep+tpe``: PrimusSampler's sweep, then TPE."""


def _oneshot_responder(body: dict[str, Any]) -> str:
    """A scripted one-shot model: the ``corrected_ranking`` field's first entries as candidates."""
    text = json.dumps(body.get("messages") or [])
    content = json.loads(text)[-1]["content"] if body.get("messages") else ""
    marker = "[[ ## corrected_ranking ## ]]"
    ranked: list[dict[str, Any]] = []
    if marker in content:
        chunk = content.split(marker, 1)[1].split("[[ ##", 1)[0].strip()
        try:
            ranked = json.loads(chunk)
        except ValueError:
            ranked = []
    cands = []
    for r in ranked[:4]:
        parts = str(r.get("config", "")).split("-")
        if len(parts) < 9:
            continue
        cands.append(
            {
                "tp": int(parts[0][2:]),
                "pp": int(parts[1][2:]),
                "ep": int(parts[2][2:]),
                "cp": int(parts[3][2:]),
                "vpp": int(parts[4][3:]),
                "mbs": int(parts[5][3:]),
                "recompute": parts[6],
                "moe_dispatcher": parts[7],
                "pp_schedule": parts[8],
                "ep_overlap": len(parts) > 9 and parts[9] == "epoverlap",
                "rationale": f"ranked by the corrected model ({r.get('expected')})",
            }
        )
    return json.dumps({"candidates": cands, "reasoning": "the corrected ranking's top"})


def _bad_responder(worst: list[dict[str, Any]]) -> Any:
    """A scripted weak model: proposes the model's worst feasible configurations, then the next worst."""
    state = {"i": 0}

    def respond(body: dict[str, Any]) -> str:
        i = state["i"]
        state["i"] += 4
        cands = [{**c, "rationale": "a hunch"} for c in worst[i : i + 4]]
        if "shortlist" in json.dumps(body.get("messages") or []):
            return json.dumps({"choices": [{"pick": 1, "rationale": "a hunch"}], "reasoning": "r"})
        return json.dumps({"candidates": cands, "reasoning": "r"})

    return respond


def _compare_sampler(
    name: str,
    land: Any,
    seed: int,
    api: tuple[str | None, str] | None,
    calls: tuple[int, float] = (8, 120.0),
) -> tuple[Any, Any]:
    """(sampler, loopback server or None) of one compared run."""
    from bench_search import ListSampler, make_sampler

    from tests.helpers.openai_server import OpenAIServer, ranking_agent

    spec = land.spec
    if name == "fallback":
        return PrimusSampler(spec, seed=seed), None
    if name == "tpe":
        return make_sampler("tpe", land, seed), None
    if name == "cmaes":
        return optuna.samplers.CmaEsSampler(seed=seed, warn_independent_sampling=False), None
    if name == "sweep+tpe":
        plan = [p.config for p in PrimusSampler(spec, seed=seed).plan]
        return _Then(ListSampler(land.space, plan), len(plan), make_sampler("tpe", land, seed)), None
    mode = "oneshot" if name == "bad-model" else name
    base, model = api if api is not None and name != "bad-model" else (None, "openai/test-model")
    server = None
    if api is None or name == "bad-model":
        if name == "bad-model":
            worst = [c.to_params() for c in reversed(land.ranked())]
            responder = _bad_responder(worst)
        elif name == "oneshot":
            responder = _oneshot_responder
        else:
            responder = ranking_agent(spec.llm.proposals_per_round)
        server = OpenAIServer([responder]).__enter__()
        base = server.url
    llm = spec.llm.model_copy(
        update={"model": model, "mode": mode, "max_calls": calls[0], "num_retries": 0, "timeout_s": calls[1]}
    )
    return PrimusSampler(spec, seed=seed, llm=llm, llm_api_base=base), server


class _Then(optuna.samplers.BaseSampler):
    """``first`` for the first ``n`` trials, then ``then``."""

    def __init__(self, first: Any, n: int, then: Any) -> None:
        self.first, self.n, self.then = first, n, then

    def _pick(self, trial: Any) -> Any:
        return self.first if trial.number < self.n else self.then

    def infer_relative_search_space(self, study: Any, trial: Any) -> Any:
        return self._pick(trial).infer_relative_search_space(study, trial)

    def sample_relative(self, study: Any, trial: Any, search_space: Any) -> Any:
        return self._pick(trial).sample_relative(study, trial, search_space)

    def sample_independent(self, study: Any, trial: Any, name: str, dist: Any) -> Any:
        return self._pick(trial).sample_independent(study, trial, name, dist)


def compare_once(
    name: str,
    land: Any,
    hidden: Any,
    seed: int,
    n: int,
    api: tuple[str | None, str] | None,
    calls: tuple[int, float] = (8, 120.0),
) -> dict[str, Any]:
    """One run of ``name``: the best value's fraction of the optimum after each trial, the planner's
    launches below 80% of the best expected, and its books (:func:`llm_accounting`)."""
    from bench_search import plain_objective

    sampler, server = _compare_sampler(name, land, seed, api, calls)
    try:
        study = optuna.create_study(
            direction="maximize", sampler=sampler, pruner=MemoryPrefilterPruner(spec=land.spec)
        )
        study.optimize(plain_objective(land, hidden), n_trials=n, catch=(RunFailure,))
    finally:
        if server is not None:
            server.__exit__(None, None, None)
    _, opt = land.optimum(hidden)
    trials = sorted(study.get_trials(deepcopy=False), key=lambda t: t.number)
    best, curve = 0.0, []
    for t in trials:
        if t.state == optuna.trial.TrialState.COMPLETE and t.value is not None:
            best = max(best, t.value)
        curve.append(best / opt)
    planner = [t for t in trials if t.user_attrs.get("phase") == "planner"]
    low = [t for t in planner if _launch_share(t) < 0.8]
    books = llm_accounting(study) if getattr(sampler, "planner", None) is not None else None
    return {
        "curve": curve,
        "planner_trials": len(planner),
        "planner_below_80pct": len(low),
        "books": books,
    }


def _books_line(b: dict[str, Any]) -> str:
    """One line of the planner's books: calls, tokens, candidates, and what it told the user."""
    return (
        f"mode {b['mode']}, {b['calls']} calls ({b['failed']} no answer, {b['unparseable']} unparseable), "
        f"{b['tokens']} tokens, {b['tool_calls']} tool calls; candidates {b['proposed']} proposed, "
        f"{b['accepted']} accepted, {b['rejected']} rejected; stopped: {b['stop_reason']}; "
        f"last error: {b['last_error']}"
    )


def _launch_share(t: Any) -> float:
    """The share of the best a planner trial was expected at when the gate let it through (the attr the
    planner records; 0 when absent, so a launch without it counts as below)."""
    return float(t.user_attrs.get(EXPECTED_SHARE) or 0.0)


def _real_model(args: argparse.Namespace) -> tuple[str | None, str] | None:
    """(API base or None for a hosted provider, model) when a real model was asked for, else ``None`` (the
    loopback's scripted models)."""
    if args.model is None and args.api_base is None:
        return None
    return args.api_base, args.model or "openai/test-model"


def compare(args: argparse.Namespace) -> int:
    """Every sampler of ``--samplers`` on every seed's hidden landscape; the table of the docs."""
    import warnings

    from bench_search import HiddenObjective as Hidden
    from bench_search import Landscape, load_spec

    warnings.filterwarnings("ignore")
    optuna.logging.set_verbosity(optuna.logging.ERROR)
    api = _real_model(args)  # a server on this machine needs no key (llm_client.NO_KEY)
    budgets = [int(b) for b in args.budgets.split(",")]
    n = max(budgets)
    names = args.samplers.split(",")
    rows: dict[str, list[dict[str, Any]]] = {s: [] for s in names}
    for path in args.studies.split(","):
        spec = load_spec(path)
        land = Landscape.of(spec)
        for seed in range(args.first_seed, args.first_seed + args.seeds):
            hidden = Hidden(spec, seed, space=land.space)
            for s in names:
                t0 = time.perf_counter()
                calls = (8 if args.max_calls is None else args.max_calls, args.timeout)
                r = compare_once(s, land, hidden, seed, n, api, calls)
                r.update(study=spec.name, seed=seed, wall_s=time.perf_counter() - t0)
                rows[s].append(r)
                print(
                    f"{spec.name} seed {seed} {s:<10} "
                    + " ".join(f"@{b}={r['curve'][min(b, len(r['curve'])) - 1]:.3f}" for b in budgets)
                    + f" planner trials {r['planner_trials']} (below 80%: {r['planner_below_80pct']})"
                    + f" {r['wall_s']:.1f}s",
                    flush=True,
                )
                if r["books"] is not None:
                    print("    planner:", _books_line(r["books"]), flush=True)
    print()
    head = "sampler     " + " ".join(f"  @{b} med/worst" for b in budgets)
    print(head + f"   to-99% med/worst   regret@{n} med   planner<80%")
    for s in names:
        rs = rows[s]
        cols = []
        for b in budgets:
            v = [r["curve"][min(b, len(r["curve"])) - 1] for r in rs]
            cols.append(f"{statistics.median(v):>7.3f}/{min(v):.3f}")
        t99 = [next((i + 1 for i, f in enumerate(r["curve"]) if f >= 0.99), None) for r in rs]
        t99s = sorted(x if x is not None else n + 1 for x in t99)

        def fmt(x: int) -> str:
            return f">{n}" if x > n else str(x)

        med = t99s[len(t99s) // 2]
        regret = statistics.median(1 - r["curve"][-1] for r in rs)
        low = sum(r["planner_below_80pct"] for r in rs)
        print(
            f"{s:<11} " + " ".join(cols) + f"   {fmt(med):>6}/{fmt(t99s[-1]):<6}        {regret:.3f}"
            f"          {low}"
        )
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=1, default=str))
    return 0


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--api-base", help="OpenAI-compatible base URL (usually ends in /v1)")
    ap.add_argument(
        "--model",
        default=None,
        help="LiteLLM model string: a hosted model (its key from the environment, e.g. anthropic/claude-sonnet-4-5 "
        "with ANTHROPIC_API_KEY) or, with --api-base, the server's (openai/NAME); default: the loopback's scripted "
        "model",
    )
    ap.add_argument(
        "--loopback", action="store_true", help="use the loopback server's scripted ranking agent"
    )
    ap.add_argument("--study", default=DEFAULT_STUDY)
    ap.add_argument("--trials", type=int, default=30)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--mode", choices=["agent", "oneshot", "rank", "auto"], default="agent")
    ap.add_argument("--max-calls", type=int, default=None, help="llm.max_calls (default 6; 8 with --compare)")
    ap.add_argument("--timeout", type=float, default=120.0, help="llm.timeout_s")
    ap.add_argument("--api-key-env", default=None)
    ap.add_argument("--json", default=None, help="also write the figures here")
    ap.add_argument(
        "--compare",
        action="store_true",
        help="compare the samplers of --samplers on hidden landscapes (--studies, --seeds, --budgets)",
    )
    ap.add_argument("--samplers", default=",".join(COMPARE))
    ap.add_argument("--studies", default=DEFAULT_STUDY, help="comma-separated study files (with --compare)")
    ap.add_argument("--seeds", type=int, default=5)
    ap.add_argument("--first-seed", type=int, default=0)
    ap.add_argument("--budgets", default="5,10,15,30")
    args = ap.parse_args(argv)
    if args.compare:
        return compare(args)
    if not args.loopback and _real_model(args) is None:
        ap.error("give --model (a hosted model), --api-base URL (an OpenAI-compatible server) or --loopback")
    if args.loopback and (args.model or args.api_base):
        ap.error("--loopback runs the scripted model: leave out --model and --api-base")
    optuna.logging.set_verbosity(optuna.logging.WARNING)
    spec = StudySpec.from_yaml(ROOT / args.study if not Path(args.study).is_absolute() else args.study)
    llm_spec = spec.llm.model_copy(
        update={
            "model": args.model or "openai/test-model",
            "mode": args.mode,
            "max_calls": 6 if args.max_calls is None else args.max_calls,
            "timeout_s": args.timeout,
            "api_key_env": args.api_key_env,
            "num_retries": 0,
        }
    )
    spec = spec.model_copy(update={"llm": llm_spec})
    hidden = HiddenObjective(spec, args.seed)
    best_possible = optimum(spec, hidden)
    server = None
    api_base = args.api_base
    if args.loopback:
        from tests.helpers.openai_server import OpenAIServer, ranking_agent

        server = OpenAIServer([ranking_agent(spec.llm.proposals_per_round)]).__enter__()
        api_base = server.url
    from primus_optuna.search.llm_preflight import preflight

    for line in preflight(llm_spec, api_base):
        print(line)
    try:
        with tempfile.TemporaryDirectory() as a, tempfile.TemporaryDirectory() as b:
            planner = run_once(spec, hidden, args.trials, args.seed, Path(a), llm=llm_spec, api_base=api_base)
            fallback = run_once(spec, hidden, args.trials, args.seed, Path(b), llm=None, api_base=None)
    finally:
        if server is not None:
            server.__exit__(None, None, None)
    books = planner["books"]
    print(f"study {spec.name}, {args.trials} trials, seed {args.seed}, planner {args.model} ({args.mode})")
    print("call  trial  mode     wall_s  requests  tools  tokens  accepted  rejected  error")
    for i, c in enumerate(planner["calls"], 1):
        print(
            f"{i:>4}  {c['trial']!s:>5}  {c['mode']!s:<7} {c['wall_s'] or 0:>7.2f}  {c['requests']!s:>8}  "
            f"{c['tool_calls']:>5}  {c['tokens']!s:>6}  {c['accepted']:>8}  {c['rejected']:>8}  {c['error'] or ''}"
        )
    walls = [c["wall_s"] for c in planner["calls"] if c["wall_s"] is not None]
    print(
        f"planner: {books['calls']} calls ({books['failed']} no answer, {books['unparseable']} unparseable), "
        f"{books['tokens']} tokens, ${books['cost_usd']:.4f}, {books['tool_calls']} tool calls, "
        f"median {statistics.median(walls) if walls else 0:.2f} s per call; candidates {books['proposed']} "
        f"proposed, {books['accepted']} accepted ({books['repaired']} repaired), {books['rejected']} rejected "
        f"{planner['rejected_by_reason'] or ''}; stopped: {books['stop_reason']}"
    )
    for name, r in (("with planner", planner), ("fallback only", fallback)):
        print(
            f"{name:<14} best {r['best']:.1f} tokens/s/GPU = {r['best'] / best_possible:.1%} of the optimum "
            f"{best_possible:.1f} (best from phase {r['best_phase']}); trials by phase {r['phases']}; "
            f"{r['wall_s']:.1f} s"
        )
    if args.json:
        Path(args.json).write_text(
            json.dumps(
                {"planner": planner, "fallback": fallback, "optimum": best_possible}, indent=1, default=str
            )
        )
    return 0


if __name__ == "__main__":
    try:
        raise SystemExit(main())
    except SpecError as e:  # a model without its key, a server without the model: the library's one line
        print(f"error: {e}", file=sys.stderr)
        raise SystemExit(2) from None
