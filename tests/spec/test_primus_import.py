"""Primus/Megatron YAML import: extends chains, env defaults, experiment overrides, study integration."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from primus_optuna.errors import SpecError
from primus_optuna.space import Space
from primus_optuna.spec import StudySpec
from primus_optuna.spec.primus_import import import_primus_yaml


def _tree(tmp_path: Path) -> Path:
    """A miniature Primus checkout: base chain -> model file; an experiment in examples/."""
    models = tmp_path / "primus" / "configs" / "models" / "megatron"
    models.mkdir(parents=True)
    (tmp_path / "primus" / "configs" / "modules" / "megatron").mkdir(parents=True)
    (tmp_path / "primus" / "configs" / "modules" / "megatron" / "pre_trainer.yaml").write_text(
        "micro_batch_size: 1\nrecompute_granularity: null\nbf16: true\nswiglu: false\n"
    )
    (models / "llama_base.yaml").write_text(
        "extends:\n  - ../../modules/megatron/pre_trainer.yaml\nswiglu: true\nnormalization: RMSNorm\n"
        "position_embedding_type: rope\nuntie_embeddings_and_output_weights: true\n"
    )
    (models / "mixtral_base.yaml").write_text(
        "extends:\n  - llama_base.yaml\nnum_experts: 8\nmoe_router_topk: 2\ntokenizer_model: mistralai/Mixtral-8x22B\n"
    )
    (models / "mixtral_8x22B_v0.1.yaml").write_text(
        "extends:\n  - mixtral_base.yaml\nnum_layers: 56\nhidden_size: 6144\nffn_hidden_size: 16384\n"
        "moe_ffn_hidden_size: 16384\nnum_attention_heads: 48\ngroup_query_attention: true\n"
        "num_query_groups: 8\nkv_channels: 128\n"
    )
    exp = tmp_path / "examples" / "megatron" / "configs" / "MI355X"
    exp.mkdir(parents=True)
    (exp / "mixtral-FP8.yaml").write_text(
        """work_group: ${PRIMUS_TEAM:amd}
exp_name: ${PRIMUS_EXP_NAME:mixtral-pretrain}
modules:
  pre_trainer:
    config: pre_trainer.yaml
    framework: megatron
    model: mixtral_8x22B_v0.1.yaml
    overrides:
      train_iters: ${TRAIN_ITERS:50}
      micro_batch_size: 2
      global_batch_size: 512
      seq_length: 8192
      tensor_model_parallel_size: 1
      pipeline_model_parallel_size: 4
      num_virtual_stages_per_pipeline_rank: 2
      expert_model_parallel_size: 8
      recompute_granularity: full
      recompute_method: block
      recompute_num_layers: 0
      fp8: hybrid
"""
    )
    return exp / "mixtral-FP8.yaml"


def test_import_follows_extends_and_overrides(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAIN_ITERS", "7")
    info = import_primus_yaml(_tree(tmp_path))
    assert info.model == {
        "name": "mixtral_8x22B_v0.1",
        "num_layers": 56,
        "hidden_size": 6144,
        "ffn_hidden_size": 16384,
        "num_attention_heads": 48,
        "num_query_groups": 8,
        "kv_channels": 128,
        "vocab_size": 32000,  # from the tokenizer name
        "num_experts": 8,
        "moe_router_topk": 2,
        "moe_ffn_hidden_size": 16384,
        "swiglu": True,  # llama_base overrides pre_trainer
        "untie_embeddings_and_output_weights": True,
        "normalization": "RMSNorm",
        "position_embedding_type": "rope",
    }
    assert info.baseline == {
        "tp": 1, "pp": 4, "ep": 8, "cp": 1, "vpp": 2, "mbs": 2,
        "recompute": "none",  # Primus' "full with 0 layers" means off
        "moe_dispatcher": "alltoall", "pp_schedule": "interleaved", "ep_overlap": False,
    }  # fmt: skip
    assert info.workload == {"seq_length": 8192, "global_batch_size": 512, "precision": "fp8"}
    assert info.overrides["train_iters"] == 7  # ${TRAIN_ITERS:50} took the environment value
    assert [Path(f).name for f in info.files][:3] == [
        "mixtral-FP8.yaml",
        "pre_trainer.yaml",
        "llama_base.yaml",
    ]


def test_study_takes_model_baseline_and_workload(tmp_path: Path) -> None:
    exp = _tree(tmp_path)
    study = tmp_path / "study.yaml"
    study.write_text(
        yaml.safe_dump(
            {
                "name": "imported",
                "model": {"primus_yaml": str(exp.relative_to(tmp_path)), "num_layers": 28},
                "cluster": {"gpu": "mi355x", "nodes": 8},
                "workload": {"global_batch_size": 256},
            }
        )
    )
    spec = StudySpec.from_yaml(study)
    assert spec.model.num_layers == 28 and spec.model.num_experts == 8  # the study file wins
    assert spec.workload.seq_length == 8192 and spec.workload.global_batch_size == 256
    assert spec.workload.precision == "fp8"
    base = Space(spec).baseline
    assert (base.pp, base.vpp, base.ep, base.mbs, base.pp_schedule) == (4, 2, 8, 2, "interleaved")


def test_written_baseline_wins(tmp_path: Path) -> None:
    data = {
        "name": "x",
        "model": {"primus_yaml": str(_tree(tmp_path))},
        "cluster": {"gpu": "mi355x", "nodes": 8},
        "workload": {"seq_length": 4096, "global_batch_size": 512},
        "search": {"baseline": {"tp": 2, "pp": 1, "ep": 8, "mbs": 1}},
    }
    spec = StudySpec.from_dict(data)
    assert spec.search.baseline.tp == 2 and spec.workload.seq_length == 4096


def test_errors_name_the_problem(tmp_path: Path) -> None:
    base = {
        "name": "x",
        "cluster": {"gpu": "mi355x", "nodes": 1},
        "workload": {"seq_length": 8, "global_batch_size": 8},
    }
    with pytest.raises(SpecError, match="primus_yaml.*not found"):
        StudySpec.from_dict({**base, "model": {"primus_yaml": str(tmp_path / "missing.yaml")}})
    a, b = tmp_path / "a.yaml", tmp_path / "b.yaml"
    a.write_text("extends: [b.yaml]\nnum_layers: 2\n")
    b.write_text("extends: [a.yaml]\n")
    with pytest.raises(SpecError, match="cycle"):
        StudySpec.from_dict({**base, "model": {"primus_yaml": str(a)}})
    exp = tmp_path / "exp.yaml"
    exp.write_text("modules:\n  pre_trainer:\n    framework: megatron\n    model: nowhere.yaml\n")
    with pytest.raises(SpecError, match="primus_root"):
        import_primus_yaml(exp)


def test_te_op_fuser_is_read_back_from_megatron_arguments(tmp_path: Path) -> None:
    """``use_transformer_engine_op_fuser: true`` (Megatron-LM's --use-transformer-engine-op-fuser,
    transformer_config.py@d98e8a64:525-527) in an argument YAML becomes ``workload.te_op_fuser``; on an AMD
    cluster the study then names the field, the Megatron-LM that Primus pins having no such argument."""
    exp = _tree(tmp_path)
    text = exp.read_text().replace(
        "      fp8: hybrid\n", "      fp8: hybrid\n      use_transformer_engine_op_fuser: true\n"
    )
    exp.write_text(text)
    assert import_primus_yaml(exp).workload["te_op_fuser"] is True
    data = {
        "name": "imported",
        "model": {"primus_yaml": str(exp)},
        "cluster": {"gpu": "b200", "nodes": 8},
    }
    assert StudySpec.from_dict(data).workload.te_op_fuser is True
    with pytest.raises(SpecError, match="workload.te_op_fuser"):
        StudySpec.from_dict({**data, "cluster": {"gpu": "mi355x", "nodes": 8}})


def test_fp8_recipe_is_read_back(tmp_path: Path) -> None:
    """``fp8_recipe`` (Megatron's --fp8-recipe; Primus experiments write it beside ``fp8: hybrid``, e.g.
    examples/megatron/configs/MI355X/deepseek_v2_lite-FP8-pretrain.yaml@fd1eeabb:96) becomes
    ``workload.fp8_recipe``: before, every imported FP8 study ran as delayed scaling. Absent, Megatron's default
    (delayed) stands; a recipe the study cannot price is refused naming the field; the export reads back."""
    from primus_optuna.space.megatron_args import megatron_overrides
    from primus_optuna.spec.primus_import import workload_from_megatron

    exp = _tree(tmp_path)
    assert "fp8_recipe" not in import_primus_yaml(exp).workload
    exp.write_text(
        exp.read_text().replace("      fp8: hybrid\n", "      fp8: hybrid\n      fp8_recipe: tensorwise\n")
    )
    assert import_primus_yaml(exp).workload["fp8_recipe"] == "tensorwise"
    data = {"name": "imported", "model": {"primus_yaml": str(exp)}, "cluster": {"gpu": "mi355x", "nodes": 8}}
    spec = StudySpec.from_dict(data)
    assert spec.workload.fp8_recipe == "tensorwise"
    assert (
        workload_from_megatron(megatron_overrides(spec, Space(spec).baseline))["fp8_recipe"] == "tensorwise"
    )
    exp.write_text(exp.read_text().replace("fp8_recipe: tensorwise", "fp8_recipe: custom"))
    with pytest.raises(SpecError, match="fp8_recipe"):
        StudySpec.from_dict(data)


AMD_FSDP2 = (
    Path(__file__).resolve().parents[1]
    / "data"
    / "primus-examples"
    / "MI300X"
    / "llama3.1_70B-BF16-pretrain.yaml"
)
"""AMD's MI300X Llama 3.1 70B example (AMD-AGI/Primus@fd1eeabb): ``use_torch_fsdp2: true``"""


def _amd_fsdp2_tree(tmp_path: Path, **extra: object) -> Path:
    """AMD's example experiment as written, its model file a miniature of Primus's llama3.1_70B.yaml."""
    exp = yaml.safe_load(AMD_FSDP2.read_text())
    exp["modules"]["pre_trainer"]["overrides"].update(extra)
    models = tmp_path / "primus" / "configs" / "models" / "megatron"
    models.mkdir(parents=True)
    (models / "llama3.1_70B.yaml").write_text(
        "num_layers: 80\nhidden_size: 8192\nffn_hidden_size: 28672\nnum_attention_heads: 64\n"
        "group_query_attention: true\nnum_query_groups: 8\nswiglu: true\nnormalization: RMSNorm\n"
        "position_embedding_type: rope\nuntie_embeddings_and_output_weights: true\nbf16: true\n"
    )
    path = tmp_path / "examples" / AMD_FSDP2.name
    path.parent.mkdir(parents=True)
    path.write_text(yaml.safe_dump(exp))
    return path


def _study(exp: Path, nodes: int) -> StudySpec:
    return StudySpec.from_dict(
        {
            "name": "fsdp",
            "model": {"primus_yaml": str(exp), "vocab_size": 128256},
            "cluster": {"gpu": "mi300x", "nodes": nodes},
            "workload": {"seq_length": 8192, "global_batch_size": 384},  # the example's mbs 3 · 64 · 2
        }
    )


def test_torch_fsdp2_example_gives_a_baseline_sharded_over_the_data_parallel_group(tmp_path: Path) -> None:
    exp = _amd_fsdp2_tree(tmp_path)
    info = import_primus_yaml(exp)
    assert info.overrides["use_torch_fsdp2"] is True and info.fsdp_replicas == 1
    spec = _study(exp, nodes=8)
    space = Space(spec)
    base = space.baseline
    assert (base.tp, base.pp, base.cp, base.dp_shard) == (1, 1, 1, 64)  # FSDP2 over all 64 GPUs
    assert space.check(base) == []


@pytest.mark.parametrize(
    ("extra", "replicas", "dp_shard"),
    [
        ({"data_parallel_replicate_degree": 2}, 2, 32),  # Primus's torch FSDP2 HSDP: 2 replicas of 32
        # Megatron-FSDP: ZeRO-3 only with optim_grads_params; HSDP over distributed-optimizer instances
        (
            {
                "use_torch_fsdp2": False,
                "use_megatron_fsdp": True,
                "data_parallel_sharding_strategy": "optim_grads_params",
                "num_distributed_optimizer_instances": 4,
            },
            4,
            16,
        ),
        (
            {"use_torch_fsdp2": False, "use_megatron_fsdp": True, "data_parallel_sharding_strategy": "optim"},
            None,
            1,
        ),
        ({"use_torch_fsdp2": False}, None, 1),  # no FSDP (the other AMD examples): nothing changes
    ],
    ids=["torch-fsdp2-hsdp", "megatron-fsdp-hsdp", "megatron-fsdp-zero1", "no-fsdp"],
)
def test_hsdp_and_megatron_fsdp_read_back(
    tmp_path: Path, extra: dict, replicas: int | None, dp_shard: int
) -> None:
    exp = _amd_fsdp2_tree(tmp_path, **extra)
    assert import_primus_yaml(exp).fsdp_replicas == replicas
    assert Space(_study(exp, nodes=8)).baseline.dp_shard == dp_shard
