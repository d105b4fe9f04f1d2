"""Presets: the Primus overlay round-trips through the importer, Megatron/Slurm argv, options, injection."""

from __future__ import annotations

import dataclasses
import shlex
from pathlib import Path

import pytest
import yaml

from primus_optuna.errors import SpecError
from primus_optuna.record.export import export_config
from primus_optuna.run.base import LaunchFailure, RunContext
from primus_optuna.run.factory import make_runner
from primus_optuna.run.presets import OVERLAY_NAME, build_command_runner, megatron_args, primus_overlay
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec
from primus_optuna.spec.primus_import import import_primus_yaml
from tests.helpers.runners import fake_argv, mixtral_spec

CONFIGS = [
    {"tp": 1, "pp": 4, "vpp": 2, "ep": 8, "mbs": 2, "pp_schedule": "interleaved"},
    {"tp": 2, "pp": 2, "ep": 4, "mbs": 1, "recompute": "full", "moe_dispatcher": "deepep"},
    {"tp": 1, "pp": 4, "vpp": 2, "ep": 8, "mbs": 1, "pp_schedule": "zbv"},
    {"tp": 1, "pp": 2, "vpp": 1, "ep": 8, "cp": 2, "mbs": 1, "pp_schedule": "zb1p"},
    {"tp": 1, "pp": 2, "vpp": 1, "ep": 8, "cp": 2, "mbs": 1, "recompute": "selective"},
    {"tp": 8, "pp": 1, "ep": 1, "mbs": 4},
    {"tp": 1, "pp": 4, "vpp": 2, "ep": 8, "mbs": 1, "pp_schedule": "interleaved", "recompute": "full:2"},
    {"tp": 1, "pp": 2, "ep": 8, "mbs": 1, "recompute": "selective:core_attn+moe"},
]


@pytest.fixture
def spec() -> StudySpec:
    return mixtral_spec()


def _ctx(spec: StudySpec, tmp_path: Path, n: int = 0) -> RunContext:
    return RunContext(spec=spec, workdir=tmp_path / f"trial-{n}", trial_number=n)


@pytest.mark.parametrize("axes", CONFIGS)
def test_primus_overlay_round_trips_through_the_importer(spec: StudySpec, axes: dict, tmp_path: Path) -> None:
    space = Space(spec)
    config = space.canonical(space.make(**axes))
    assert not space.check(config), space.check(config)
    (tmp_path / "mixtral.yaml").write_text("num_layers: 56\nhidden_size: 6144\n")
    experiment = {"modules": {"pre_trainer": {"model": "mixtral.yaml", "overrides": {"train_iters": 50}}}}
    path = tmp_path / "overlay.yaml"
    path.write_text(yaml.safe_dump(primus_overlay(spec, config, experiment=experiment)))
    info = import_primus_yaml(path)
    assert info.baseline == config.to_params()
    assert info.overrides["train_iters"] == 50 and info.model["num_layers"] == 56
    assert info.workload["global_batch_size"] == 128 and info.workload["precision"] == "fp8"
    # and as a study: the overlay's baseline is the configuration
    data = spec.to_dict() | {"model": {"primus_yaml": str(path), **spec.model.model_dump()}}
    data["search"] = {k: v for k, v in data["search"].items() if k != "baseline"}
    assert Space(StudySpec.from_dict(data)).canonical(Space(StudySpec.from_dict(data)).baseline) == config


def test_primus_runner_writes_overlay_and_passes_it(spec: StudySpec, tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text(
        "modules:\n  pre_trainer:\n    model: mixtral_8x22B_v0.1.yaml\n    overrides: {lr: 1.0e-5}\n"
    )
    runner = make_runner(
        spec.model_copy(
            update={
                "runner": spec.runner.model_copy(
                    update={
                        "kind": "primus",
                        "options": {"launch": fake_argv("echo", "{overlay}"), "experiment": str(exp)},
                    }
                )
            }
        )
    )
    config = Space(spec).make(**CONFIGS[1])
    launch, _ = runner.build(config, _ctx(spec, tmp_path))
    overlay = tmp_path / "trial-0" / OVERLAY_NAME
    assert launch.argv[-1] == str(overlay.resolve()) and launch.env["EXP"] == str(overlay.resolve())
    o = yaml.safe_load(overlay.read_text())["modules"]["pre_trainer"]["overrides"]
    assert o["lr"] == 1.0e-5 and o["train_iters"] == 10 and o["log_interval"] == 1
    assert (o["tensor_model_parallel_size"], o["moe_token_dispatcher_type"], o["recompute_granularity"]) == (
        2,
        "flex",
        "full",
    )
    # end to end: the launch command runs with the overlay and its Primus log is parsed
    runner.argv = fake_argv("replay", "primus.log")
    m = runner.run(config, _ctx(spec, tmp_path, 1))
    assert m.tokens_per_s_per_gpu == pytest.approx(3620.8) and (tmp_path / "trial-1" / OVERLAY_NAME).is_file()


HOSTS = [f"n{i}" for i in range(8)]


def _node_launch(script: Path, rank: int) -> tuple[list[str], dict[str, str], str]:
    """(argv, env, host) of node ``rank`` in a nodes.sh script written by the multi-node wrap."""
    lines = [ln for ln in script.read_text().splitlines() if ln.endswith(" &")]
    words = shlex.split(lines[rank].removesuffix(" &"))
    remote = shlex.split(words[-1].replace("; ", " ; "))
    env = {}
    for i, w in enumerate(remote):
        if w == "export":
            k, v = remote[i + 1].rstrip(";").split("=", 1)
            env[k] = v
    argv = remote[remote.index("exec") + 1 :]
    return argv, env, words[-2]


def test_megatron_argv(spec: StudySpec, tmp_path: Path) -> None:
    runner = build_command_runner(spec, "megatron", {"megatron_path": "/opt/Megatron-LM", "hosts": HOSTS})
    config = Space(spec).make(**CONFIGS[0])
    launch, _ = runner.build(config, _ctx(spec, tmp_path))
    assert launch.argv == ["bash", str(tmp_path / "trial-0" / "nodes.sh")]
    a, _, host = _node_launch(tmp_path / "trial-0" / "nodes.sh", 0)
    assert host == "n0"
    assert a[:5] == ["torchrun", "--nnodes", "8", "--nproc-per-node", "8"]
    assert "/opt/Megatron-LM/pretrain_gpt.py" in a
    pairs = {a[i]: a[i + 1] for i in range(len(a) - 1) if a[i].startswith("--")}
    assert (pairs["--node-rank"], pairs["--master-addr"], pairs["--master-port"]) == ("0", "n0", "29500")
    assert (
        pairs["--pipeline-model-parallel-size"] == "4"
        and pairs["--num-virtual-stages-per-pipeline-rank"] == "2"
    )
    assert pairs["--expert-model-parallel-size"] == "8" and pairs["--micro-batch-size"] == "2"
    assert pairs["--fp8-format"] == "hybrid" and pairs["--num-experts"] == "8"
    assert not any("zero-bubble" in x or "turbo" in x for x in a)
    build = runner.build

    def node0(axes: dict, n: int) -> list[str]:
        build(Space(spec).make(**axes), _ctx(spec, tmp_path, n))
        return _node_launch(tmp_path / f"trial-{n}" / "nodes.sh", 0)[0]

    sel = node0(CONFIGS[-1], 2)
    i = sel.index("--recompute-granularity")
    assert sel[i + 1] == "selective" and sel[sel.index("--recompute-modules") + 1 :][:2] == [
        "core_attn",
        "moe",
    ]
    blk = node0(CONFIGS[-2], 3)
    blk_pairs = {blk[i]: blk[i + 1] for i in range(len(blk) - 1) if blk[i].startswith("--")}
    assert (blk_pairs["--recompute-method"], blk_pairs["--recompute-num-layers"]) == ("block", "2")
    with pytest.raises(LaunchFailure, match="zero bubble"):
        runner.build(Space(spec).make(**CONFIGS[2]), _ctx(spec, tmp_path, 1))


@pytest.mark.parametrize("mode", ["srun", "sbatch"])
def test_slurm_wraps_a_preset(spec: StudySpec, tmp_path: Path, mode: str) -> None:
    opts = {"preset": "megatron", "mode": mode, "slurm_args": ["--partition=gpu"], "megatron_path": "/m"}
    runner = build_command_runner(spec, "slurm", opts)
    launch, _ = runner.build(Space(spec).make(**CONFIGS[0]), _ctx(spec, tmp_path))
    node = (tmp_path / "trial-0" / "node.sh").read_text()
    assert "scontrol show hostnames" in node and "exec torchrun --nnodes 8" in node
    assert (
        '--node-rank "${SLURM_NODEID}" --master-addr "${MASTER_ADDR}" --master-port "${MASTER_PORT}"' in node
    )
    assert "__PRIMUS_OPTUNA" not in node and "rdzv" not in node
    assert launch.argv[0] == mode and "--partition=gpu" in launch.argv and "--nodes=8" in launch.argv
    assert "--gpus-per-node=8" in launch.argv  # Slurm allocates the GPUs the study uses
    name = next(a for a in launch.argv if a.startswith("--job-name="))
    assert launch.cancel == ["scancel", name.replace("--job-name=", "--name=")]
    if mode == "sbatch":
        out = tmp_path / "trial-0" / "slurm.out"
        assert "--wait" in launch.argv and launch.extra_logs == [out]
        assert launch.follow_log == out  # the job's own log is followed while it runs


def test_options_are_validated(spec: StudySpec) -> None:
    with pytest.raises(SpecError, match="runner.options.argv: required"):
        build_command_runner(spec, "command", {})
    with pytest.raises(SpecError, match="unknown option"):
        build_command_runner(spec, "local", {"iters": 3})
    with pytest.raises(SpecError, match="timeout_s"):
        build_command_runner(spec, "command", {"argv": ["x"], "timeout_s": -1})
    with pytest.raises(SpecError, match="hosts"):
        build_command_runner(spec, "megatron", {"megatron_path": "/m", "hosts": ["a b;c"] * 8})
    with pytest.raises(SpecError, match="preset"):
        build_command_runner(spec, "slurm", {"preset": "slurm"})
    with pytest.raises(SpecError, match=r"unknown field \{cmd\}"):
        build_command_runner(spec, "command", {"argv": ["bash", "-c", "{cmd}"]})
    with pytest.raises(SpecError, match="unknown field"):
        build_command_runner(spec, "primus", {"launch": ["x", "{overlay}", "{HOME}"]})


def test_injection_cannot_reach_any_preset(spec: StudySpec, tmp_path: Path) -> None:
    good = Space(spec).make(**CONFIGS[0])
    bad = [
        ("recompute", "full\n--load /etc"),
        ("pp_schedule", "1f1b'; touch /tmp/pwn; '"),
        ("mbs", "2 --save /x"),
    ]
    evil = []
    for axis, value in bad:
        if axis != "mbs":  # categorical values are refused when the config is built...
            with pytest.raises(ValueError, match=axis):
                dataclasses.replace(good, **{axis: value})
        c = dataclasses.replace(good)
        object.__setattr__(c, axis, value)  # ...and by every runner when one is forced in
        evil.append(c)
    runners = [
        build_command_runner(spec, "megatron", {"megatron_path": "/m", "hosts": HOSTS}),
        build_command_runner(spec, "primus", {"launch": fake_argv("echo", "{overlay}")}),
        build_command_runner(spec, "slurm", {"preset": "command", "argv": ["train", "{pp_schedule}"]}),
    ]
    for r in runners:
        for i, config in enumerate(evil):
            with pytest.raises(LaunchFailure, match="refused"):
                r.build(config, _ctx(spec, tmp_path, i))
    assert not list(tmp_path.rglob("*.yaml")) and not list(tmp_path.rglob("*.sh"))


def test_factory_builds_every_kind(spec: StudySpec) -> None:
    options = {
        "command": {"argv": ["train"]},
        "local": {},
        "primus": {"hosts": [f"n{i}" for i in range(8)]},
        "megatron": {"megatron_path": "/m", "hosts": [f"n{i}" for i in range(8)]},
        "slurm": {"preset": "primus", "mode": "sbatch"},
        "profile": {"scale": 0.1, "device": "cpu"},
    }
    for kind, opts in options.items():
        s = spec.model_copy(update={"runner": spec.runner.model_copy(update={"kind": kind, "options": opts})})
        assert make_runner(s).kind == kind
    assert make_runner(spec, "analytical").kind == "analytical"
    # --runner with another kind than the study's: the study's options are not passed to it
    s = spec.model_copy(update={"runner": spec.runner.model_copy(update={"kind": "megatron", "options": {}})})
    with pytest.raises(SpecError, match="megatron_path: required"):
        make_runner(s)
    assert make_runner(s, "local").kind == "local"
    with pytest.raises(SpecError, match="unknown runner kind"):
        make_runner(spec, "ssh")


def test_megatron_argv_carries_mla_moe_fields_and_the_layout(tmp_path: Path) -> None:
    """DeepSeek-V3 launches with its MLA, shared-expert, dense-first, MTP flags and the study's layout;
    GPT-OSS with its window, sinks and biases."""
    from tests.conftest import STUDIES

    v3 = StudySpec.from_yaml(STUDIES / "deepseek-v3-mi355x-fp8.yaml")
    a = megatron_args(v3, Space(v3).baseline, 10)
    pairs = {a[i]: a[i + 1] for i in range(len(a) - 1) if a[i].startswith("--")}
    assert "--multi-latent-attention" in a and pairs["--q-lora-rank"] == "1536"
    assert pairs["--kv-lora-rank"] == "512" and pairs["--qk-pos-emb-head-dim"] == "64"
    assert pairs["--moe-shared-expert-intermediate-size"] == "2048"
    assert pairs["--moe-layer-freq"] == "([0]*3+[1]*58)" and pairs["--mtp-num-layers"] == "1"
    assert pairs["--pipeline-model-parallel-layout"] == "Et*4|(t*4|)*14tmL"
    assert "--disable-bias-linear" in a
    # the recipe's precision-aware optimizer (Megatron-Core argument names)
    assert "--use-precision-aware-optimizer" in a and "--grad-reduce-in-bf16" in a
    assert pairs["--main-params-dtype"] == "fp32" and pairs["--main-grads-dtype"] == "bf16"
    assert pairs["--exp-avg-dtype"] == "bf16" and pairs["--exp-avg-sq-dtype"] == "bf16"
    oss = StudySpec.from_yaml(STUDIES / "gpt-oss-120b-h100-bf16.yaml")
    a = megatron_args(oss, Space(oss).baseline, 10)
    pairs = {a[i]: a[i + 1] for i in range(len(a) - 1) if a[i].startswith("--")}
    assert pairs["--window-size"] == "128,0" and pairs["--window-attn-skip-freq"] == "2"
    assert pairs["--softmax-type"] == "learnable" and "--disable-bias-linear" not in a


PAO_WORKLOADS = [
    {},
    {"grad_reduce_in_fp32": False, "fp8_param_gather": True},
    {
        "grad_reduce_in_fp32": False,
        "precision_aware_optimizer": True,
        "main_grads_dtype": "bf16",
        "exp_avg_dtype": "bf16",
        "exp_avg_sq_dtype": "bf16",
    },
    {
        "precision_aware_optimizer": True,
        "main_params_dtype": "fp16",
        "exp_avg_dtype": "fp8",
        "exp_avg_sq_dtype": "fp16",
    },
]


@pytest.mark.parametrize("over", PAO_WORKLOADS)
def test_optimizer_and_gradient_dtypes_round_trip_through_the_importer(
    spec: StudySpec, over: dict, tmp_path: Path
) -> None:
    """The workload's memory levers (2-byte gradients, FP8 parameters, the precision-aware optimizer's dtypes)
    written into a Primus overlay read back as the same workload; Megatron argv carries them too."""
    data = spec.to_dict()
    data["workload"] = {**data["workload"], **over}
    lever_spec = StudySpec.from_dict(data)
    config = Space(lever_spec).baseline
    (tmp_path / "mixtral.yaml").write_text("num_layers: 56\nhidden_size: 6144\n")
    experiment = {"modules": {"pre_trainer": {"model": "mixtral.yaml", "overrides": {}}}}
    path = tmp_path / "overlay.yaml"
    path.write_text(yaml.safe_dump(primus_overlay(lever_spec, config, experiment=experiment)))
    imported = import_primus_yaml(path).workload
    w = lever_spec.workload.model_dump()
    keys = ("grad_reduce_in_fp32", "fp8_param_gather", "precision_aware_optimizer", "main_params_dtype")
    keys += ("main_grads_dtype", "exp_avg_dtype", "exp_avg_sq_dtype")
    defaults = type(lever_spec.workload)(seq_length=1, global_batch_size=1).model_dump()
    assert {k: imported.get(k, defaults[k]) for k in keys} == {k: w[k] for k in keys}
    # and as a study whose workload comes from the overlay
    study = {**data, "model": {"primus_yaml": str(path), **lever_spec.model.model_dump()}}
    study["workload"] = {"seq_length": 8192, "global_batch_size": 128}
    assert StudySpec.from_dict(study).workload == lever_spec.workload
    argv = megatron_args(lever_spec, config, 10)
    assert ("--use-precision-aware-optimizer" in argv) == bool(over.get("precision_aware_optimizer"))
    if over.get("precision_aware_optimizer"):
        assert argv[argv.index("--exp-avg-dtype") + 1] == over["exp_avg_dtype"]


# --- issue 20: what the Primus runner pins, complete experiments, multi-node launches ---------------------------
def _on(spec: StudySpec, nodes: int = 1, **workload) -> StudySpec:
    data = spec.to_dict()
    data["cluster"] = {**data["cluster"], "nodes": nodes}
    data["workload"] = {**data["workload"], **workload}
    data["search"]["baseline"] = {"tp": 1, "pp": 1, "ep": 8, "mbs": 1}
    return StudySpec.from_dict(data)


def test_primus_runner_pins_what_the_estimate_assumed(spec: StudySpec, tmp_path: Path) -> None:
    """An experiment's FSDP, recompute_layer_ids and shared-expert overlap would run another job than the
    estimated one (Primus-Turbo's DeepEP also asserts no shared-expert overlap and at most 32 CUs at ep >= 16:
    primus/backends/megatron/patches/args/rocm_arg_validation.py@fd1eeabb:221-233)."""
    exp = {"modules": {"pre_trainer": {"model": "mixtral_8x22B_v0.1.yaml", "overrides": {
        "use_torch_fsdp2": True, "use_megatron_fsdp": True, "recompute_layer_ids": [0, 7],
        "moe_shared_expert_overlap": True, "turbo_deepep_num_cu": 80, "lr": 3.0e-4,
    }}}}  # fmt: skip
    c = Space(spec).make(tp=1, pp=4, vpp=2, ep=8, mbs=1, pp_schedule="interleaved", moe_dispatcher="deepep")
    o = primus_overlay(spec, c, experiment=exp)["modules"]["pre_trainer"]["overrides"]
    assert (o["use_torch_fsdp2"], o["use_megatron_fsdp"], o["recompute_layer_ids"]) == (False, False, None)
    assert o["moe_shared_expert_overlap"] is False and o["lr"] == 3.0e-4
    assert o["turbo_deepep_num_cu"] == 80  # ep 8: intranode, any CU count
    assert o["use_rocm_mem_info"] is True  # the per-rank peak the log parser reads
    qwen = StudySpec.from_dict(
        {**spec.to_dict(), "model": {"catalog": "qwen3-30b-a3b"}, "workload": {"seq_length": 4096,
         "global_batch_size": 64}, "search": {"baseline": {"tp": 1, "pp": 1, "ep": 16, "mbs": 1}}}
    )  # fmt: skip
    c16 = Space(qwen).make(moe_dispatcher="deepep")
    assert c16.ep == 16 and not Space(qwen).check(c16)
    exp["modules"]["pre_trainer"]["model"] = "qwen3_30B_A3B.yaml"
    o16 = primus_overlay(qwen, c16, experiment=exp)["modules"]["pre_trainer"]["overrides"]
    assert o16["turbo_deepep_num_cu"] == 32


def test_primus_runner_refuses_an_experiment_of_another_model(spec: StudySpec, tmp_path: Path) -> None:
    exp = tmp_path / "exp.yaml"
    exp.write_text("modules:\n  pre_trainer:\n    model: m.yaml\n    overrides: {num_layers: 32}\n")
    with pytest.raises(SpecError, match=r"runner.options.experiment: .*num_layers: 32.* 56"):
        build_command_runner(spec, "primus", {"experiment": str(exp), "launch": fake_argv("echo")})


def test_primus_without_an_experiment_writes_a_complete_one(spec: StudySpec, tmp_path: Path) -> None:
    """The top-level keys of every Primus experiment (examples/megatron/configs/MI355X/
    qwen3_30B_A3B-FP8-pretrain.yaml@fd1eeabb:1-12) and the model YAML Primus ships for the catalog model."""
    doc = primus_overlay(spec, Space(spec).baseline)
    assert {"work_group", "user_name", "exp_name", "workspace"} <= set(doc)
    trainer = doc["modules"]["pre_trainer"]
    assert (trainer["framework"], trainer["config"], trainer["model"]) == (
        "megatron",
        "pre_trainer.yaml",
        "mixtral_8x22B_v0.1.yaml",
    )
    assert trainer["overrides"]["max_position_embeddings"] == 8192
    custom = StudySpec.from_dict({**spec.to_dict(), "model": {**spec.model.model_dump(), "name": "my-moe"}})
    with pytest.raises(SpecError, match="runner.options.model"):
        build_command_runner(custom, "primus", {"launch": fake_argv("echo")})
    r = build_command_runner(custom, "primus", {"launch": fake_argv("echo"), "model": "mine.yaml"})
    r.build(Space(custom).baseline, _ctx(custom, tmp_path))
    doc = yaml.safe_load((tmp_path / "trial-0" / OVERLAY_NAME).read_text())
    assert doc["modules"]["pre_trainer"]["model"] == "mine.yaml" and doc["workspace"]


def test_primus_launch_environment_single_and_multi_node(spec: StudySpec, tmp_path: Path) -> None:
    """Primus's examples/run_pretrain.sh@fd1eeabb:71-75 reads NNODES, NODE_RANK, GPUS_PER_NODE, MASTER_ADDR and
    MASTER_PORT (defaults: one node); MXFP8 needs NVTE_ROCM_ENABLE_MXFP8=1 on ROCm
    (patches/args/rocm_arg_validation.py@fd1eeabb:175-178)."""
    one = _on(spec, 1, fp8_recipe="mxfp8")
    launch, _ = build_command_runner(one, "primus", {"launch": fake_argv("echo")}).build(
        Space(one).baseline, _ctx(one, tmp_path)
    )
    env = launch.env
    assert (env["NNODES"], env["NODE_RANK"], env["GPUS_PER_NODE"]) == ("1", "0", "8")
    assert (env["MASTER_ADDR"], env["MASTER_PORT"]) == ("127.0.0.1", "29500")
    assert env["NVTE_ROCM_ENABLE_MXFP8"] == "1"
    assert (
        "NVTE_ROCM_ENABLE_MXFP8"
        not in build_command_runner(spec, "primus", {"launch": fake_argv("echo")}).env
    )
    # 8 nodes: Primus's single-node script needs a host list (or Slurm)...
    with pytest.raises(SpecError, match="runner.options.hosts"):
        build_command_runner(spec, "primus", {})
    # ...its Slurm script places the nodes itself from NNODES (run_slurm_pretrain.sh@fd1eeabb:34-68)
    slurm_script = {"launch": ["bash", "examples/run_slurm_pretrain.sh"]}
    launch, _ = build_command_runner(spec, "primus", slurm_script).build(
        Space(spec).baseline, _ctx(spec, tmp_path, 1)
    )
    assert launch.env["NNODES"] == "8" and "NODE_RANK" not in launch.env and "MASTER_ADDR" not in launch.env
    # ...and with hosts, one launch per node over ssh, node 0 the master
    r = build_command_runner(spec, "primus", {"hosts": HOSTS, "primus_path": str(tmp_path)})
    launch, _ = r.build(Space(spec).baseline, _ctx(spec, tmp_path, 2))
    script = tmp_path / "trial-2" / "nodes.sh"
    assert launch.argv == ["bash", str(script)]
    for rank in (0, 5):
        argv, env, host = _node_launch(script, rank)
        assert host == HOSTS[rank] and argv == ["bash", "examples/run_pretrain.sh"]
        assert (env["NODE_RANK"], env["NNODES"], env["MASTER_ADDR"], env["GPUS_PER_NODE"]) == (
            str(rank), "8", "n0", "8",
        )  # fmt: skip
        assert env["EXP"].endswith(OVERLAY_NAME)
    assert f"cd {tmp_path}" in script.read_text() and "__PRIMUS_OPTUNA" not in script.read_text()


def test_primus_under_slurm_gets_the_node_rank_from_slurm(spec: StudySpec, tmp_path: Path) -> None:
    runner = build_command_runner(spec, "slurm", {"preset": "primus"})
    runner.build(Space(spec).baseline, _ctx(spec, tmp_path))
    node = (tmp_path / "trial-0" / "node.sh").read_text()
    assert 'export NODE_RANK="${SLURM_NODEID}"' in node and 'export MASTER_ADDR="${MASTER_ADDR}"' in node
    assert "export NNODES=8" in node and "export GPUS_PER_NODE=8" in node
    assert "__PRIMUS_OPTUNA" not in node
    with pytest.raises(SpecError, match="hosts"):
        build_command_runner(spec, "slurm", {"preset": "primus", "hosts": HOSTS})


def test_megatron_without_slurm_needs_hosts_and_never_a_placeholder(spec: StudySpec, tmp_path: Path) -> None:
    with pytest.raises(SpecError, match="runner.options.hosts: the study runs on 8 nodes"):
        build_command_runner(spec, "megatron", {"megatron_path": "/m"})
    with pytest.raises(SpecError, match="3 hosts"):
        build_command_runner(spec, "megatron", {"megatron_path": "/m", "hosts": HOSTS[:3]})
    runner = build_command_runner(spec, "megatron", {"megatron_path": "/m", "hosts": HOSTS})
    runner.build(Space(spec).baseline, _ctx(spec, tmp_path))
    script = tmp_path / "trial-0" / "nodes.sh"
    ranks = []
    for rank in range(8):
        argv, _, host = _node_launch(script, rank)
        pairs = {argv[i]: argv[i + 1] for i in range(len(argv) - 1)}
        ranks.append(pairs["--node-rank"])
        assert host == HOSTS[rank] and pairs["--master-addr"] == "n0" and pairs["--nnodes"] == "8"
    assert ranks == [str(i) for i in range(8)] and "__PRIMUS_OPTUNA" not in script.read_text()
    one = _on(spec, 1)
    launch, _ = build_command_runner(one, "megatron", {"megatron_path": "/m"}).build(
        Space(one).baseline, _ctx(one, tmp_path, 1)
    )
    pairs = {launch.argv[i]: launch.argv[i + 1] for i in range(len(launch.argv) - 1)}
    assert (pairs["--nnodes"], pairs["--node-rank"], pairs["--master-addr"]) == ("1", "0", "127.0.0.1")


@pytest.mark.parametrize(
    ("axes", "expect"),
    [
        ({"tp": 2}, "1"),
        ({"cp": 2}, "1"),
        ({"tp": 1}, None),
        ({"tp": 2, "ep": 4, "ep_overlap": True}, None),
    ],
)
def test_cuda_device_max_connections_where_megatron_requires_it(
    spec: StudySpec, tmp_path: Path, axes: dict, expect: str | None
) -> None:
    """tp > 1 or cp > 1 need CUDA_DEVICE_MAX_CONNECTIONS=1 before Blackwell, unless EP overlap (which wants
    more) is on (megatron/training/arguments.py@d98e8a64:1451-1479)."""
    one = _on(spec, 1)
    space = Space(one)
    c = space.canonical(space.make(**axes))
    assert not space.check(c), space.check(c)
    launch, _ = build_command_runner(one, "megatron", {"megatron_path": "/m"}).build(c, _ctx(one, tmp_path))
    assert launch.env.get("CUDA_DEVICE_MAX_CONNECTIONS") == expect


def test_sbatch_log_is_followed_live_and_the_job_cancelled_when_stopped(
    spec: StudySpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """With sbatch the job's output goes to slurm.out: early stopping reads that file while the job runs, and
    stopping the trial runs scancel for the job (killing sbatch --wait does not end a Slurm job)."""
    import sys

    from primus_optuna.run.base import EarlyStopped

    bindir = tmp_path / "bin"
    bindir.mkdir()
    marker = tmp_path / "scancel.args"
    (bindir / "sbatch").write_text(
        f"#!{sys.executable}\n"
        "import sys, time\n"
        "out = next(a.split('=', 1)[1] for a in sys.argv if a.startswith('--output='))\n"
        "with open(out, 'w') as f:\n"
        "    for i in range(1, 40):\n"
        "        f.write(f' iteration {i}/ 40 | elapsed time per iteration (ms): 100.0 | "
        "tokens per GPU (tokens/s/GPU): 10.0 |\\n'); f.flush(); time.sleep(0.05)\n"
        "    time.sleep(60)\n"
    )
    (bindir / "scancel").write_text(f'#!/bin/sh\necho "$@" > {marker}\n')
    for f in bindir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{__import__('os').environ['PATH']}")
    runner = build_command_runner(spec, "slurm", {"preset": "command", "argv": ["train"], "mode": "sbatch"})
    seen = []

    def on_iteration(it, running):
        seen.append(it.iteration)
        return "slow: stop" if it.iteration >= 5 else None

    ctx = RunContext(spec=spec, workdir=tmp_path / "trial-7", trial_number=7, on_iteration=on_iteration)
    with pytest.raises(EarlyStopped, match="slow"):
        runner.run(Space(spec).baseline, ctx)
    assert seen and seen[-1] >= 5
    assert marker.read_text().strip().startswith("--name=primus-optuna-7-")


def test_an_interrupted_slurm_trial_cancels_its_job(
    spec: StudySpec, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C / SIGTERM of `run` ends the srun client; the job is cancelled with scancel as well, so that its
    allocation does not outlive the trial."""
    import os
    import signal
    import threading

    from primus_optuna.run.interrupt import Interrupted, request_stop, reset_stop

    bindir = tmp_path / "bin"
    bindir.mkdir()
    marker = tmp_path / "scancel.args"
    (bindir / "srun").write_text("#!/bin/sh\nsleep 60\n")
    (bindir / "scancel").write_text(f'#!/bin/sh\necho "$@" > {marker}\n')
    for f in bindir.iterdir():
        f.chmod(0o755)
    monkeypatch.setenv("PATH", f"{bindir}:{os.environ['PATH']}")
    runner = build_command_runner(spec, "slurm", {"preset": "command", "argv": ["train"]})
    timer = threading.Timer(1.0, request_stop, args=(signal.SIGTERM,))
    timer.start()
    try:
        with pytest.raises(Interrupted):
            runner.run(Space(spec).baseline, _ctx(spec, tmp_path, 3))
    finally:
        timer.cancel()
        reset_stop()
    assert marker.read_text().strip().startswith("--name=primus-optuna-3-")


def test_megatron_launch_gets_the_te_op_fuser_environment(spec: StudySpec, tmp_path: Path) -> None:
    """workload.te_op_fuser: the Megatron runner passes --use-transformer-engine-op-fuser and launches with
    NVTE_CUTEDSL_FUSED_GROUPED_MLP=1 (without it Megatron asserts on a gated expert MLP,
    megatron/core/transformer/moe/experts.py@d98e8a64:286-290, 450-455); the Primus runner refuses it, the
    Megatron-LM Primus pins (d3528a21) has no such argument."""
    data = _on(spec).to_dict()
    data["cluster"]["gpu"] = "b200"
    on = StudySpec.from_dict({**data, "workload": {**data["workload"], "te_op_fuser": True}})
    off = StudySpec.from_dict(data)
    c = Space(on).baseline
    launch, _ = build_command_runner(on, "megatron", {"megatron_path": "/m"}).build(c, _ctx(on, tmp_path))
    assert launch.env.get("NVTE_CUTEDSL_FUSED_GROUPED_MLP") == "1"
    assert "--use-transformer-engine-op-fuser" in launch.argv
    launch, _ = build_command_runner(off, "megatron", {"megatron_path": "/m"}).build(
        c, _ctx(off, tmp_path, 1)
    )
    assert "NVTE_CUTEDSL_FUSED_GROUPED_MLP" not in launch.env
    assert "--use-transformer-engine-op-fuser" not in launch.argv
    with pytest.raises(SpecError, match="workload.te_op_fuser"):
        primus_overlay(on, c)


def test_megatron_preflight_names_a_missing_checkout_or_launcher(spec: StudySpec, tmp_path: Path) -> None:
    one = _on(spec, 1)
    # building never touches the file system (a checkout on the cluster); the run's pre-flight does
    runner = build_command_runner(one, "megatron", {"megatron_path": str(tmp_path / "nowhere")})
    with pytest.raises(SpecError, match=r"runner.options.megatron_path: .*nowhere' has no pretrain_gpt.py"):
        runner.preflight()
    (tmp_path / "pretrain_gpt.py").write_text("")
    opts = {"megatron_path": str(tmp_path), "torchrun": ["no-such-torchrun-here"]}
    with pytest.raises(SpecError, match="runner.options.torchrun: 'no-such-torchrun-here' is not on PATH"):
        build_command_runner(one, "megatron", opts).preflight()
    # on other hosts (ssh) or under Slurm the launcher is theirs: only the shared checkout is checked
    many = build_command_runner(spec, "megatron", {**opts, "hosts": HOSTS})
    many.preflight()
    build_command_runner(one, "megatron", {**opts, "torchrun": ["sh"]}).preflight()


# --- hosts: a GB200/GB300 node (the NVLink domain) is several hosts of 4 GPUs --------------------------------------
GB200 = Path(__file__).resolve().parents[2] / "studies" / "qwen3-235b-a22b-gb200-fp8.yaml"


def _gb200() -> StudySpec:
    spec = StudySpec.from_yaml(GB200)
    assert (spec.cluster.nodes, spec.cluster.gpus_per_node, spec.cluster.host_gpus) == (4, 64, 4)
    return spec


def _pairs(words: list[str]) -> dict[str, str]:
    return {words[i]: words[i + 1] for i in range(len(words) - 1)}


def test_a_gb200_megatron_launch_starts_4_processes_on_each_of_64_hosts(tmp_path: Path) -> None:
    spec, hosts = _gb200(), [f"tray{i}" for i in range(64)]
    with pytest.raises(
        SpecError, match=r"runs on 64 hosts \(4 nodes of 64 GPUs, 4 GPUs per host\) but 4 hosts"
    ):
        build_command_runner(spec, "megatron", {"megatron_path": "/m", "hosts": hosts[:4]})
    runner = build_command_runner(spec, "megatron", {"megatron_path": "/m", "hosts": hosts})
    runner.build(Space(spec).baseline, _ctx(spec, tmp_path))
    script = tmp_path / "trial-0" / "nodes.sh"
    assert sum(ln.endswith(" &") for ln in script.read_text().splitlines()) == 64  # one torchrun per host
    for rank in (0, 17, 63):
        argv, _, host = _node_launch(script, rank)
        pairs = _pairs(argv)
        assert (pairs["--nnodes"], pairs["--nproc-per-node"]) == ("64", "4")
        assert (host, pairs["--node-rank"], pairs["--master-addr"]) == (hosts[rank], str(rank), "tray0")


def test_a_gb200_primus_launch_exports_hosts_as_its_nodes(tmp_path: Path) -> None:
    """examples/run_pretrain.sh@fd1eeabb:447-449 runs torchrun --nproc_per_node $GPUS_PER_NODE --nnodes $NNODES."""
    spec, hosts = _gb200(), [f"tray{i}" for i in range(64)]
    runner = build_command_runner(spec, "primus", {"launch": ["bash", "run_pretrain.sh"], "hosts": hosts})
    runner.build(Space(spec).baseline, _ctx(spec, tmp_path))
    _, env, _ = _node_launch(tmp_path / "trial-0" / "nodes.sh", 5)
    assert (env["NNODES"], env["GPUS_PER_NODE"], env["NODE_RANK"]) == ("64", "4", "5")


@pytest.mark.parametrize("preset", ["megatron", "primus", "command"])
def test_slurm_asks_for_a_task_and_4_gpus_on_each_gb200_host(tmp_path: Path, preset: str) -> None:
    spec = _gb200()
    inner = {
        "megatron": {"megatron_path": "/m"},
        "primus": {},
        "command": {"argv": ["train.sh", "{hosts}", "{gpus_per_host}", "{nodes}", "{gpus_per_node}"]},
    }[preset]
    launch, _ = build_command_runner(spec, "slurm", {"preset": preset, **inner}).build(
        Space(spec).baseline, _ctx(spec, tmp_path)
    )
    assert {"--nodes=64", "--ntasks-per-node=1", "--gpus-per-node=4"} <= set(launch.argv)
    node = (tmp_path / "trial-0" / "node.sh").read_text()
    if preset == "megatron":
        assert "exec torchrun --nnodes 64 --nproc-per-node 4 " in node
    if preset == "primus":
        assert "export NNODES=64" in node and "export GPUS_PER_NODE=4" in node
    if preset == "command":  # {hosts} {gpus_per_host} next to the study's nodes of the NVLink domain
        assert "exec train.sh 64 4 4 64" in node


def test_slurm_runs_the_local_preset_on_one_host(spec: StudySpec, tmp_path: Path) -> None:
    """``local`` starts the whole world on this host (torchrun --standalone --nnodes 1)."""
    two = _on(spec, 2)
    launch, _ = build_command_runner(two, "slurm", {"preset": "local"}).build(
        Space(two).baseline, _ctx(two, tmp_path)
    )
    assert {"--nodes=1", "--gpus-per-node=16"} <= set(launch.argv)


def test_a_gb200_primus_runner_under_its_own_slurm_script_is_told_the_hosts(tmp_path: Path) -> None:
    """Primus's run_slurm_pretrain.sh starts srun -N $NNODES --ntasks-per-node=1 (@fd1eeabb:34, 47-50)."""
    spec = _gb200()
    launch, _ = build_command_runner(spec, "primus", {"launch": ["bash", "run_slurm_pretrain.sh"]}).build(
        Space(spec).baseline, _ctx(spec, tmp_path)
    )
    assert (launch.env["NNODES"], launch.env["GPUS_PER_NODE"]) == ("64", "4")


# --- vendors: Primus-Turbo (use_turbo_*, enable_primus_turbo, ...) and rocm-smi are ROCm's --------------------------
AMD_EXAMPLE = Path(__file__).resolve().parents[1] / "data" / "primus-examples" / "MI355X"


@pytest.mark.parametrize(
    ("study", "example"),
    [
        ("gpt-oss-120b-h100-bf16.yaml", "gpt_oss_120B-BF16-pretrain.yaml"),
        ("qwen3-235b-a22b-gb200-fp8.yaml", "qwen3_235B_A22B-FP8-pretrain.yaml"),
    ],
)
def test_an_nvidia_primus_overlay_runs_no_rocm_only_feature(study: str, example: str) -> None:
    """Without Primus-Turbo Primus runs upstream's DeepEP (the flex dispatcher's deepep backend); an AMD example's
    Turbo switches merged into an NVIDIA study are dropped (Primus's defaults, all off: primus_turbo.yaml@fd1eeabb)."""
    from primus_optuna.space.megatron_args import ROCM_ONLY

    spec = StudySpec.from_yaml(Path(__file__).resolve().parents[2] / "studies" / study)
    assert spec.cluster.gpu.vendor == "nvidia"
    experiment = yaml.safe_load((AMD_EXAMPLE / example).read_text())
    turbo = {k for k, v in experiment["modules"]["pre_trainer"]["overrides"].items() if k in ROCM_ONLY and v}
    assert "enable_primus_turbo" in turbo  # AMD's example turns Turbo on
    space = Space(spec)
    config = space.canonical(space.make(**{**space.baseline.to_params(), "moe_dispatcher": "deepep"}))
    for exp in (experiment, None):
        o = primus_overlay(spec, config, experiment=exp, environ={})["modules"]["pre_trainer"]["overrides"]
        assert not set(ROCM_ONLY) & set(o), set(ROCM_ONLY) & set(o)
        assert (o["moe_token_dispatcher_type"], o["moe_flex_dispatcher_backend"]) == ("flex", "deepep")
    exported = yaml.safe_load(export_config(spec, config, "primus"))["modules"]["pre_trainer"]["overrides"]
    assert not set(ROCM_ONLY) & set(exported)


def test_an_amd_primus_overlay_keeps_turbo_deepep_and_the_rocm_memory_report(tmp_path: Path) -> None:
    spec = StudySpec.from_yaml(
        Path(__file__).resolve().parents[2] / "studies" / "deepseek-v3-mi355x-fp8.yaml"
    )
    space = Space(spec)
    config = space.canonical(space.make(**{**space.baseline.to_params(), "moe_dispatcher": "deepep"}))
    experiment = yaml.safe_load((AMD_EXAMPLE / "deepseek_v3-FP8-pretrain.yaml").read_text())
    o = primus_overlay(spec, config, experiment=experiment, environ={})["modules"]["pre_trainer"]["overrides"]
    assert (
        o["enable_primus_turbo"]
        and o["use_turbo_deepep"]
        and o["moe_enable_deepep"]
        and o["use_rocm_mem_info"]
    )
    assert o["use_turbo_rms_norm"] is True  # the example's own Turbo switches stay on AMD GPUs


def test_the_local_preset_on_cuda_fits_one_host() -> None:
    """``local`` runs the whole world on this host, one process per cuda device (workloads/gpt.py)."""
    one_tray = StudySpec.from_dict(
        {
            "name": "tray",
            "model": {"catalog": "llama3.1-8b"},
            "cluster": {"gpu": "gb200", "nodes": 1, "gpus_per_node": 8},
            "workload": {"seq_length": 4096, "global_batch_size": 64},
        }
    )
    with pytest.raises(
        SpecError, match=r"device: cuda starts the study's 8 GPU processes on this host, which holds 4"
    ):
        build_command_runner(one_tray, "local", {"device": "cuda"})
    build_command_runner(one_tray, "local", {"device": "cpu"})


PROBE = ["primus_optuna.workloads.netprobe", "--out", "/shared/net.csv"]


@pytest.mark.parametrize("kind", ["megatron", "torchtitan"])
def test_module_launch_starts_one_torchrun_per_host_over_ssh(
    spec: StudySpec, tmp_path: Path, kind: str
) -> None:
    """``calibrate --network`` through ``hosts``: the nodes script a trial gets, each host's torchrun with its
    rank, the first host as master, the module and its arguments after ``-m``."""
    from primus_optuna.run.presets import module_launch

    options = {
        "hosts": HOSTS,
        "torchrun": ["/venv/bin/torchrun"],
        "master_port": 29555,
        **({"megatron_path": "/m"} if kind == "megatron" else {"train_iters": 5}),
    }
    launch = module_launch(spec, kind, options, PROBE, tmp_path, {}, 300.0)
    assert launch.argv == ["bash", str(tmp_path / "nodes.sh")]
    for rank in (0, 7):
        argv, _, host = _node_launch(tmp_path / "nodes.sh", rank)
        pairs = {argv[i]: argv[i + 1] for i in range(len(argv) - 1)}
        assert host == HOSTS[rank] and argv[0] == "/venv/bin/torchrun"
        assert (pairs["--node-rank"], pairs["--master-addr"], pairs["--master-port"]) == (
            str(rank),
            "n0",
            "29555",
        )
        assert (pairs["--nnodes"], pairs["--nproc-per-node"]) == ("8", "8")
        assert argv[argv.index("-m") + 1 :] == PROBE


def test_module_launch_under_slurm_asks_for_every_host(spec: StudySpec, tmp_path: Path) -> None:
    """Slurm: one task per host (even when the inner preset is ``local``), the node rank from ``$SLURM_NODEID``,
    the job's time from the probe's timeout."""
    from primus_optuna.run.presets import module_launch

    options = {"preset": "local", "slurm_args": ["--partition=gpu"]}
    launch = module_launch(spec, "slurm", options, PROBE, tmp_path, {}, 600.0)
    assert launch.argv[0] == "srun" and "--nodes=8" in launch.argv and "--gpus-per-node=8" in launch.argv
    assert "--time=10" in launch.argv and "--partition=gpu" in launch.argv and launch.cancel[0] == "scancel"
    node = (tmp_path / "node.sh").read_text()
    assert '--node-rank "${SLURM_NODEID}"' in node and "torch.distributed.run" in node
    assert "-m primus_optuna.workloads.netprobe --out /shared/net.csv" in node


@pytest.mark.parametrize(
    ("kind", "options", "match"),
    [
        ("megatron", {"megatron_path": "/m"}, "runner.options.hosts: the study's runner"),
        ("local", {}, "runner.kind: 'local' runs on this machine"),
        ("slurm", {"preset": "local", "mode": "salloc"}, "runner.options.mode"),
    ],
)
def test_module_launch_refuses_a_runner_that_places_no_hosts(
    spec: StudySpec, tmp_path: Path, kind: str, options: dict, match: str
) -> None:
    from primus_optuna.run.presets import module_launch

    with pytest.raises(SpecError, match=match):
        module_launch(spec, kind, options, PROBE, tmp_path, {}, 60.0)
    assert list(tmp_path.iterdir()) == []


def _titan_spec(**options: object) -> StudySpec:
    data = StudySpec.from_yaml("studies/llama3.1-70b-h100-bf16.yaml").to_dict()
    data["runner"] = {"kind": "torchtitan", "options": options}
    return StudySpec.from_dict(data)


TITAN_AXES = {
    "tp": 8,
    "pp": 2,
    "vpp": 2,
    "mbs": 1,
    "pp_schedule": "interleaved",
    "dp_shard": 4,
    "recompute": "full",
}


def test_torchtitan_argv(tmp_path: Path) -> None:
    """torchrun over ``-m torchtitan.train`` on each host, the export's arguments plus the run's, the
    activation-checkpointing subcommand last (TorchTitan's own parser accepts it: tests/titan)."""
    spec = _titan_spec(
        hosts=HOSTS, train_iters=7, extra_args=["--hf_assets_path", "/data/llama"], cwd=str(tmp_path)
    )
    runner = make_runner(spec)
    assert runner.kind == "torchtitan"
    launch, _ = runner.build(Space(spec).make(**TITAN_AXES), _ctx(spec, tmp_path))
    assert launch.argv == ["bash", str(tmp_path / "trial-0" / "nodes.sh")]
    a, _, host = _node_launch(tmp_path / "trial-0" / "nodes.sh", 3)
    assert host == "n3" and a[:5] == ["torchrun", "--nnodes", "8", "--nproc-per-node", "8"]
    pairs = {a[i]: a[i + 1] for i in range(len(a) - 1) if a[i].startswith("--")}
    assert (pairs["--node-rank"], pairs["--master-addr"]) == ("3", "n0")
    i = a.index("-m")
    assert a[i + 1 : i + 6] == ["torchtitan.train", "--module", "llama3", "--config", "llama3_70b"]
    assert pairs["--parallelism.pipeline_parallel_schedule"] == "Interleaved1F1B"
    assert pairs["--parallelism.data_parallel_shard_degree"] == "4"
    assert pairs["--training.steps"] == "7" and pairs["--metrics.log_freq"] == "1"
    assert pairs["--hf_assets_path"] == "/data/llama" and "--checkpoint.no-enable" in a
    assert a[-1] == "activation-checkpoint:full"
    assert f"cd {tmp_path}" in (tmp_path / "trial-0" / "nodes.sh").read_text()


def test_torchtitan_under_slurm_and_refusals(tmp_path: Path) -> None:
    spec = _titan_spec(preset="torchtitan", compile=True)
    spec = spec.model_copy(update={"runner": spec.runner.model_copy(update={"kind": "slurm"})})
    runner = make_runner(spec)
    launch, _ = runner.build(Space(spec).make(**TITAN_AXES), _ctx(spec, tmp_path))
    assert launch.argv[0] == "srun" and "--nodes=8" in launch.argv
    node = (tmp_path / "trial-0" / "node.sh").read_text()
    assert "-m torchtitan.train --module llama3" in node and "--compile.enable" in node
    assert '--node-rank "${SLURM_NODEID}"' in node
    with pytest.raises(LaunchFailure, match="zero-bubble"):  # what TorchTitan cannot run is never launched
        runner.build(
            Space(spec).make(**{**TITAN_AXES, "vpp": 1, "pp_schedule": "zb1p"}), _ctx(spec, tmp_path, 1)
        )
    data = mixtral_spec().to_dict()
    data["runner"] = {"kind": "torchtitan", "options": {"hosts": HOSTS}}
    with pytest.raises(SpecError, match="fp8_recipe"):  # refused before the first trial
        make_runner(StudySpec.from_dict(data)).preflight()
    with pytest.raises(SpecError, match="runner.options.train_iters"):
        make_runner(_titan_spec(train_iters=0))
