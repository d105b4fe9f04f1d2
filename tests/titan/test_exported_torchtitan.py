"""The CI framework check for TorchTitan: the top trials of every shipped study's analytical run, exported with
``--format torchtitan``, are accepted by TorchTitan 0.3's own code with their degrees intact.

For each shipped study whose model and precision TorchTitan 0.3 has a registry function for (the study run as a
TorchTitan study, ``runner.kind: torchtitan``, so that its rules apply), its five best trials:

- ``ConfigManager().parse_args(argv)`` (``torchtitan/config/manager.py@0.3.0:34-46``): the registry function,
  tyro over ``Trainer.Config`` and its ``__post_init__`` (the pipeline micro-batch divisibility and the CUDA-graph
  refusals, ``torchtitan/trainer.py@0.3.0:118-210``);
- ``ParallelDims.from_config`` (``torchtitan/distributed/parallel_dims.py@0.3.0:153-189``: the product of the
  degrees is the world) and its ``build_mesh`` on torch's fake process group of the study's world (:208-389: every
  mesh, the expert mesh ``dp_shard·cp·tp / ep`` included, built and its size validated);
- with pipelining, TorchTitan's stage count (``_get_pipeline_metadata``, ``pipeline_parallel.py@0.3.0:194-264``)
  and split (``_generate_llm_fqn_per_model_part``, :366-476) over the registry model: ``pp · vpp`` stages of
  ``layers / (pp · vpp)`` layers, and torch's schedule class of the exported name;
- the batch as the trainer derives it (``trainer.py@0.3.0:415-440``): the gradient-accumulation steps and the
  pipeline micro-batches equal the trial's micro-batches;
- the parsed degrees, activation-checkpointing mode, sequence length and precision equal the export, and the
  registry model's layers, width and vocabulary equal the study's.

Studies with no TorchTitan form (a model or FP8 recipe TorchTitan 0.3 has no registry function for) are refused
by the export, naming the fix; where the model has a bf16 function, the study is run in bf16 and checked too.
torchtitan 0.3.0 and the few packages its imports need are installed by scripts/bootstrap.sh from
scripts/requirements-titan.txt (without their declared dependencies); nothing of TorchTitan is stood in for.
"""

from __future__ import annotations

import logging
import shlex
from typing import Any

import pytest

from primus_optuna.errors import SpecError
from primus_optuna.record.export import export_config
from primus_optuna.space.torchtitan_args import SCHEDULES, TITAN_MODELS, titan_args, titan_target
from primus_optuna.spec import StudySpec
from tests.conftest import STUDIES
from tests.helpers.studies import analytical_run

pytest.importorskip(  # what ConfigManager imports for a model: the registries' own imports included
    "torchtitan.models.llama3.config_registry",
    reason="torchtitan 0.3.0 is not importable (scripts/bootstrap.sh installs scripts/requirements-titan.txt)",
    exc_type=ImportError,  # also a dependency of its imports missing (triton, tensorboard, datasets)
)
manager = pytest.importorskip("torchtitan.config.manager")

pytestmark = pytest.mark.titan

STUDY_FILES = sorted(STUDIES.glob("*.yaml"))
TOP = 5
"""best trials checked per study"""


def titan_study(spec: StudySpec, **workload: Any) -> StudySpec:
    """``spec`` as a TorchTitan study (its rules apply), with ``workload`` changed."""
    data = spec.to_dict()
    data["runner"] = {"kind": "torchtitan"}
    data["workload"] = {**data["workload"], **workload}
    if data["workload"]["precision"] != "fp8":  # the FP8-only settings go with it
        data["workload"] = {k: v for k, v in data["workload"].items() if not k.startswith("fp8_")}
    return StudySpec.from_dict(data)


def _top(spec: StudySpec) -> list[Any]:
    import optuna

    study, _ = analytical_run(spec)
    done = study.get_trials(deepcopy=False, states=(optuna.trial.TrialState.COMPLETE,))
    best = sorted(done, key=lambda t: -t.values[0])[:TOP]
    from primus_optuna.record.export import trial_config

    return [trial_config(t, spec) for t in best]


@pytest.fixture(scope="module")
def exported() -> tuple[list[tuple[StudySpec, Any]], dict[str, str]]:
    """(TorchTitan study, config) of the top trials of every shipped study that has a TorchTitan form, and the
    export's refusal of those that do not."""
    logging.getLogger("torchtitan").setLevel(logging.ERROR)
    out, refused = [], {}
    for path in STUDY_FILES:
        spec = titan_study(StudySpec.from_yaml(path))
        try:
            titan_target(spec)
        except SpecError as exc:
            refused[spec.name] = str(exc)
            if spec.model.name not in TITAN_MODELS:
                continue
            spec = titan_study(spec, precision="bf16")
        out += [(spec, c) for c in _top(spec)]
    return out, refused


def exported_argv(spec: StudySpec, config: Any) -> list[str]:
    """The words of ``export --format torchtitan`` as a shell reads them (comments dropped)."""
    text = export_config(spec, config, "torchtitan", header="a header")
    body = "\n".join(line for line in text.splitlines() if not line.startswith("#"))
    return shlex.split(body.replace("\\\n", " "))  # a shell joins the continuation lines


def build_meshes(dims: Any, world: int) -> dict[str, int]:
    """``ParallelDims.build_mesh`` (parallel_dims.py@0.3.0:208-389: every mesh unflattened from the world and its
    sizes validated, the expert mesh ``efsdp = dp_shard·cp·tp / ep`` included) on torch's fake process group of
    ``world`` ranks; the dense meshes' sizes."""
    import torch.distributed as dist
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world)
    try:
        dims.build_mesh()
        names = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
        return {n: dims.get_optional_mesh(n, include_singleton_axes=True).size() for n in names}
    finally:
        dist.destroy_process_group()


def check_export(spec: StudySpec, config: Any) -> None:
    """TorchTitan's code on the exported argv; assertion errors name what differs."""
    from torch.distributed.pipelining.schedules import PipelineScheduleSingle, get_schedule_class
    from torchtitan.distributed.activation_checkpoint import FullAC, SelectiveAC
    from torchtitan.distributed.parallel_dims import ParallelDims
    from torchtitan.distributed.pipeline_parallel import (
        _generate_llm_fqn_per_model_part,
        _get_pipeline_metadata,
    )

    c = config.derive(spec.world, spec.workload.global_batch_size)
    argv = exported_argv(spec, config)
    assert argv == titan_args(spec, config)
    cfg = manager.ConfigManager().parse_args(argv)
    p, t = cfg.parallelism, cfg.training
    dims = ParallelDims.from_config(p, spec.world)
    assert (dims.dp_replicate, dims.dp_shard, dims.tp, dims.pp, dims.cp, dims.ep) == (
        c.dp // c.dp_shard,
        c.dp_shard,
        c.tp,
        c.pp,
        c.cp,
        c.ep,
    ), "degrees"
    meshes = build_meshes(dims, spec.world)
    assert meshes == {
        "pp": c.pp,
        "dp_replicate": c.dp // c.dp_shard,
        "dp_shard": c.dp_shard,
        "cp": c.cp,
        "tp": c.tp,
    }
    ac = {"none": type(None), "selective": SelectiveAC.Config, "full": FullAC.Config}[c.recompute]
    assert type(cfg.activation_checkpoint) is ac, "activation checkpointing"
    assert (t.seq_len, t.global_batch_size, t.mixed_precision_param) == (
        spec.workload.seq_length,
        spec.workload.global_batch_size,
        "bfloat16",
    )
    model = cfg.model_spec.model
    m = spec.model
    assert (len(model.layers), model.dim, model.vocab_size) == (m.num_layers, m.hidden_size, m.vocab_size)
    # the trainer's sequence and batch arithmetic (trainer.py@0.3.0:306-315, 415-440)
    sp = dims.tp if p.enable_sequence_parallel else 1
    assert t.seq_len % (sp * (2 * dims.cp if dims.cp > 1 else 1)) == 0, "sequence length"
    batch_degree = dims.dp_replicate * dims.dp_shard
    assert t.global_batch_size % (t.local_batch_size * batch_degree) == 0, "global batch"
    accumulation = t.global_batch_size // (t.local_batch_size * batch_degree)
    if c.pp == 1:
        assert (accumulation, t.local_batch_size) == (c.num_microbatches, c.mbs), "micro-batches"
        return
    assert (
        accumulation == 1 and t.local_batch_size // p.pipeline_parallel_microbatch_size == c.num_microbatches
    )
    assert p.pipeline_parallel_microbatch_size == c.mbs
    schedule = get_schedule_class(p.pipeline_parallel_schedule)
    assert issubclass(schedule, PipelineScheduleSingle) == (c.vpp == 1), "schedule"
    stages, layers, first, last = _get_pipeline_metadata(dims, p, model)
    assert stages == c.pp * c.vpp, "pipeline stages"
    split = _generate_llm_fqn_per_model_part(stages, layers, first, last)
    per_stage = {sum(n.startswith("layers.") for n in s) for s in split}
    assert per_stage == {m.num_layers // stages}, f"layers per stage {per_stage}"


def test_every_exported_configuration_is_accepted_by_torchtitan(exported) -> None:
    configs, refused = exported
    names = {StudySpec.from_yaml(p).name for p in STUDY_FILES}
    checked = {spec.name for spec, _ in configs}
    assert checked | set(refused) == names
    assert {"llama3.1-70b-h100-bf16", "qwen3-30b-a3b-h200-bf16", "gpt-oss-120b-h100-bf16"} <= checked
    assert "deepseek-v3-mi355x-fp8" in checked  # in bf16: DeepSeek-V3 has no MXFP8 registry function
    assert all("runner.options" in why or "fp8_recipe" in why for why in refused.values()), refused
    failures = []
    for spec, config in configs:
        try:
            check_export(spec, config)
        except (AssertionError, ValueError, SystemExit) as exc:
            failures.append(f"{spec.name} {config.key()}: {type(exc).__name__}: {exc}")
    assert not failures, f"{len(failures)} of {len(configs)} exports refused:\n" + "\n".join(failures)


@pytest.mark.parametrize(
    "axes",
    [
        {"tp": 8, "pp": 2, "vpp": 1, "mbs": 1, "pp_schedule": "1f1b", "dp_shard": 4, "recompute": "full"},
        {
            "tp": 4,
            "pp": 4,
            "vpp": 2,
            "mbs": 1,
            "pp_schedule": "interleaved",
            "dp_shard": 2,
            "recompute": "full",
        },
        {
            "tp": 8,
            "pp": 2,
            "vpp": 4,
            "mbs": 2,
            "pp_schedule": "interleaved",
            "dp_shard": 2,
            "recompute": "selective",
        },
        {"tp": 8, "pp": 4, "vpp": 2, "mbs": 1, "pp_schedule": "zbv", "dp_shard": 2, "recompute": "none"},
        {
            "tp": 2,
            "cp": 2,
            "pp": 1,
            "vpp": 1,
            "mbs": 1,
            "pp_schedule": "1f1b",
            "dp_shard": 8,
            "recompute": "full",
        },
    ],
    ids=["1f1b-hsdp", "interleaved-vpp2", "interleaved-vpp4", "zbv", "fsdp-cp-ddp"],
)
def test_pipelined_and_hsdp_exports_are_accepted(axes: dict[str, Any]) -> None:
    """Pipelines (1F1B, interleaved with 2 and 4 stages per rank, ZBV) and HSDP, which the studies' best trials
    need not reach, through the same check."""
    from primus_optuna.space import Space

    spec = titan_study(StudySpec.from_yaml(STUDIES / "llama3.1-70b-h100-bf16.yaml"))
    space = Space(spec)
    c = space.make(**axes)
    assert space.check(c) == [], space.check(c)
    check_export(spec, c)


def test_torchtitan_refuses_what_it_cannot_run() -> None:
    """The negative check: TorchTitan's own code refuses a broken export (so the check above can fail)."""
    from torchtitan.distributed.parallel_dims import ParallelDims

    spec = titan_study(StudySpec.from_yaml(STUDIES / "llama3.1-70b-h100-bf16.yaml"))
    from primus_optuna.space import Space

    c = Space(spec).make(tp=8, pp=2, vpp=1, cp=1, mbs=1, recompute="full", pp_schedule="1f1b", dp_shard=4)
    argv = titan_args(spec, c)
    i = argv.index("--training.local_batch_size")
    bad = [*argv[: i + 1], "3", *argv[i + 2 :]]  # 3 sequences do not split into micro-batches of 2
    j = bad.index("--parallelism.pipeline_parallel_microbatch_size")
    bad[j + 1] = "2"
    with pytest.raises(SystemExit):  # tyro reports Trainer.Config's ValueError (trainer.py@0.3.0:130-139)
        manager.ConfigManager().parse_args(bad)
    cuda_graphs = [a for a in argv if a != "--training.disable_cuda_graphs"]
    with pytest.raises(SystemExit):  # CUDA graphs with pipelining (trainer.py@0.3.0:183-187)
        manager.ConfigManager().parse_args(cuda_graphs)
    with pytest.raises(SystemExit):  # an activation-checkpointing mode it does not have
        manager.ConfigManager().parse_args([*argv[:-1], "activation-checkpoint:selective-2"])
    cfg = manager.ConfigManager().parse_args(argv)
    with pytest.raises(AssertionError, match="WORLD_SIZE"):  # degrees that do not cover the world
        ParallelDims.from_config(cfg.parallelism, spec.world * 2)
    # experts that do not divide dp_shard·cp·tp (rule titan_ep): the expert mesh cannot be built
    moe = ParallelDims(dp_replicate=1, dp_shard=1, cp=1, tp=2, pp=4, ep=4, world_size=8)
    with pytest.raises(ValueError, match="mesh_sizes"):
        build_meshes(moe, 8)
    from torch.distributed.pipelining.schedules import get_schedule_class

    with pytest.raises(ValueError):  # zb1p has no name there: the export refuses it (space/torchtitan_args)
        get_schedule_class("ZB1P")
    assert set(SCHEDULES.values()) <= {"1F1B", "Interleaved1F1B", "ZBVZeroBubble"}


def test_the_torchtitan_presets_arguments_are_accepted() -> None:
    """The runner preset's ``torchtitan.train`` arguments (the export plus steps, logging every step, no
    checkpoint, validation or profiling, the user's extra arguments) parse as they are meant."""
    from primus_optuna.run.presets import TorchTitanOptions, torchtitan_args
    from primus_optuna.space import Space

    spec = titan_study(StudySpec.from_yaml(STUDIES / "llama3.1-70b-h100-bf16.yaml"))
    c = Space(spec).make(tp=8, pp=2, vpp=2, mbs=1, pp_schedule="interleaved", dp_shard=4, recompute="full")
    opts = TorchTitanOptions(train_iters=7, extra_args=["--hf_assets_path", "/data/llama"])
    cfg = manager.ConfigManager().parse_args(torchtitan_args(spec, c, opts))
    assert (cfg.training.steps, cfg.metrics.log_freq, cfg.hf_assets_path) == (7, 1, "/data/llama")
    assert not (cfg.checkpoint.enable or cfg.validator.enable or cfg.profiler.enable_profiling)
    assert cfg.parallelism.pipeline_parallel_schedule == "Interleaved1F1B"
    check_export(spec, c)


def test_without_sequence_parallelism() -> None:
    """``workload.sequence_parallel: false`` reaches ``parallelism.enable_sequence_parallel`` (configs.py@0.3.0:160)."""
    from primus_optuna.space import Space

    spec = titan_study(StudySpec.from_yaml(STUDIES / "llama3.1-70b-h100-bf16.yaml"), sequence_parallel=False)
    c = Space(spec).make(tp=8, pp=1, vpp=1, mbs=1, pp_schedule="1f1b", dp_shard=8, recompute="full")
    check_export(spec, c)
    assert (
        manager.ConfigManager().parse_args(exported_argv(spec, c)).parallelism.enable_sequence_parallel
        is False
    )


@pytest.mark.parametrize(("model", "key"), [(m, k) for m, (_, fns) in TITAN_MODELS.items() for k in fns])
def test_every_registry_function_is_the_catalogs_model(model: str, key: str) -> None:
    """Each registry function the export names exists, and its model has the catalog model's layers, width and
    vocabulary; an MXFP8 one converts its linears to MXFP8 (it is built only where torchao and an MXFP8 GPU are:
    components/quantization/mx.py@0.3.0, so its source is read)."""
    import importlib
    import inspect

    from primus_optuna.spec.model import MODEL_CATALOG

    module, fns = TITAN_MODELS[model]
    fn = getattr(importlib.import_module(f"torchtitan.models.{module}.config_registry"), fns[key])
    if key == "mxfp8":
        assert "MXFP8LinearConverter" in inspect.getsource(fn)
        return
    m, cat = fn().model_spec.model, MODEL_CATALOG[model]
    assert (len(m.layers), m.dim, m.vocab_size) == (cat.num_layers, cat.hidden_size, cat.vocab_size)
