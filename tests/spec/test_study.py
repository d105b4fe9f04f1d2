import json
import re
from pathlib import Path

import pytest
import yaml

from primus_optuna import GPUSpec, ModelSpec, SpecError, StudySpec
from tests.conftest import STUDIES, small_dense_study, small_moe_study


@pytest.mark.parametrize("path", sorted(STUDIES.glob("*.yaml")), ids=lambda p: p.name)
def test_every_shipped_study_loads(path):
    spec = StudySpec.from_yaml(path)
    assert spec.world == spec.cluster.nodes * spec.cluster.gpus_per_node
    assert spec.name


def test_flagship_resolves_catalogs(flagship_path):
    spec = StudySpec.from_yaml(flagship_path)
    assert spec.model.num_layers == 56 and spec.model.num_experts == 8 and spec.model.query_groups == 8
    assert spec.cluster.gpu.name == "mi355x" and spec.cluster.gpu.topology == "mesh"
    assert spec.world == 64 and spec.max_tp == 8
    assert spec.search.baseline.pp_schedule == "interleaved"
    # the device-reported capacity in GiB (HBM stacks are binary-sized), never a GB figure
    assert spec.cluster.gpu.hbm_gib == pytest.approx(287.9)


def test_dict_and_yaml_agree(tmp_path):
    data = small_moe_study()
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    assert StudySpec.from_yaml(p) == StudySpec.from_dict(data)
    # to_dict round-trips (resolved catalogs are inline fields)
    spec = StudySpec.from_dict(data)
    assert StudySpec.from_dict(spec.to_dict()) == spec


def test_unknown_key_rejected_with_field_name():
    data = small_moe_study()
    data["workload"]["seq_len"] = 4096
    with pytest.raises(SpecError) as e:
        StudySpec.from_dict(data)
    assert "workload.seq_len" in str(e.value) and "unknown key" in str(e.value)


def test_unknown_key_names_the_nearest_key_of_its_section():
    data = small_moe_study()
    data["workload"]["seq_lenght"] = data["workload"].pop("seq_length")
    data["cluster"]["gpu_per_node"] = data["cluster"].pop("gpus_per_node")
    with pytest.raises(SpecError) as e:
        StudySpec.from_dict(data)
    assert "workload.seq_lenght: unknown key; did you mean 'seq_length'?" in str(e.value)
    assert "cluster.gpu_per_node: unknown key; did you mean 'gpus_per_node'?" in str(e.value)
    data = small_moe_study()
    data["llm"] = {"modle": "openai/gpt-4o"}  # as close to `mode` as to `model`: both named
    with pytest.raises(SpecError) as e:
        StudySpec.from_dict(data)
    assert "llm.modle: unknown key; did you mean 'mode' or 'model'?" in str(e.value)


def test_misspelt_model_catalog_is_named_not_read_as_an_inline_model():
    data = small_moe_study()
    data["model"] = {"catalgo": "mixtral-8x7b"}
    with pytest.raises(SpecError) as e:
        StudySpec.from_dict(data)
    assert "unknown key 'catalgo'; did you mean 'catalog'?" in str(e.value)
    assert "num_layers" not in str(e.value)


def test_out_of_range_number_names_the_bound_and_the_fix():
    data = small_moe_study()
    data["workload"]["global_batch_size"] = -8
    with pytest.raises(SpecError) as e:
        StudySpec.from_dict(data)
    assert "workload.global_batch_size: must be > 0, got -8; set a value above 0" in str(e.value)


def test_unknown_catalog_names_suggest():
    data = small_moe_study()
    data["cluster"]["gpu"] = "mi350x"
    with pytest.raises(SpecError) as e:
        StudySpec.from_dict(data)
    assert "cluster.gpu" in str(e.value) and "mi355x" in str(e.value)
    data = small_moe_study()
    data["model"] = {"catalog": "mixtral-8x23b"}
    with pytest.raises(SpecError) as e:
        StudySpec.from_dict(data)
    assert "did you mean" in str(e.value) and "mixtral-8x22b" in str(e.value)
    # names compare in lower case, as the catalog is: a rack's upper-case name suggests its GPU first
    data = small_moe_study()
    data["cluster"]["gpu"] = "GB300-NVL72"
    with pytest.raises(SpecError) as e:
        StudySpec.from_dict(data)
    assert "did you mean 'gb300'" in str(e.value)


@pytest.mark.parametrize(
    "section,key,value",
    [("cluster", "nodes", 0), ("cluster", "gpus_per_node", -8), ("workload", "global_batch_size", 0)],
)
def test_non_positive_sizes_rejected(section, key, value):
    data = small_moe_study()
    data[section][key] = value
    with pytest.raises(SpecError) as e:
        StudySpec.from_dict(data)
    assert f"{section}.{key}" in str(e.value)


def test_gpu_overrides_and_inline_gpu():
    data = small_moe_study()
    data["cluster"]["gpu"] = {"catalog": "mi300x", "hbm_gb": 150, "inter_node_bw_gbs": 25}
    spec = StudySpec.from_dict(data)
    assert spec.cluster.gpu.hbm_gb == 150 and spec.cluster.gpu.bf16_tflops == 1307
    inline = GPUSpec.catalog("h100").model_dump() | {"name": "my-gpu", "memory_gib": None}
    data["cluster"]["gpu"] = inline
    gpu = StudySpec.from_dict(data).cluster.gpu
    assert gpu.name == "my-gpu"
    # without a device-reported capacity, the datasheet GB figure is converted to GiB (conservative)
    assert gpu.hbm_gib == pytest.approx(80e9 / 2**30)


def test_model_overrides_and_inline_model():
    data = small_dense_study()
    data["model"] = {"catalog": "llama3.1-8b", "num_layers": 8}
    assert StudySpec.from_dict(data).model.num_layers == 8
    data["model"] = {
        "num_layers": 4,
        "hidden_size": 512,
        "ffn_hidden_size": 2048,
        "num_attention_heads": 8,
        "vocab_size": 1000,
    }
    m = StudySpec.from_dict(data).model
    assert m.head_dim == 64 and m.query_groups == 8 and not m.is_moe


def test_hf_config_import(tmp_path):
    cfg = {
        "num_hidden_layers": 56,
        "hidden_size": 6144,
        "intermediate_size": 16384,
        "num_attention_heads": 48,
        "num_key_value_heads": 8,
        "vocab_size": 32000,
        "num_local_experts": 8,
        "num_experts_per_tok": 2,
        "tie_word_embeddings": False,
        "hidden_act": "silu",
        "model_type": "mixtral",
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    data = small_moe_study()
    data["model"] = {"hf_config": "config.json"}
    p = tmp_path / "s.yaml"
    p.write_text(yaml.safe_dump(data))
    m = StudySpec.from_yaml(p).model
    ref = ModelSpec.catalog("mixtral-8x22b")
    for field in (
        "num_layers",
        "hidden_size",
        "num_attention_heads",
        "vocab_size",
        "num_experts",
        "moe_router_topk",
    ):
        assert getattr(m, field) == getattr(ref, field)
    assert m.query_groups == 8 and m.expert_ffn == 16384 and m.untie_embeddings_and_output_weights


def test_hf_config_missing_file_is_clear(tmp_path):
    data = small_moe_study()
    data["model"] = {"hf_config": "nope.json"}
    with pytest.raises(SpecError) as e:
        StudySpec.from_dict(data, base_dir=tmp_path)
    assert "model" in str(e.value) and "not found" in str(e.value)


def test_api_key_in_study_file_is_refused():
    data = small_moe_study()
    data["llm"] = {"model": "openai/gpt-4o", "api_key": "sk-secret"}
    with pytest.raises(SpecError) as e:
        StudySpec.from_dict(data)
    assert "environment" in str(e.value) and "sk-secret" not in str(e.value)


def test_fp8_needs_fp8_hardware():
    data = small_dense_study()
    data["cluster"]["gpu"] = "a100-80gb"
    data["workload"]["precision"] = "fp8"
    with pytest.raises(SpecError, match="fp8"):
        StudySpec.from_dict(data)


def test_search_section_validation():
    with pytest.raises(SpecError, match="axis"):
        StudySpec.from_dict(small_moe_study(axes={"tensor": [1]}))
    with pytest.raises(SpecError, match="recompute"):
        StudySpec.from_dict(small_moe_study(axes={"recompute": ["partial"]}))
    with pytest.raises(SpecError, match="positive integers"):
        StudySpec.from_dict(small_moe_study(axes={"tp": [0, 1]}))
    with pytest.raises(SpecError, match="objective"):
        StudySpec.from_dict(small_moe_study(objective="mfu"))
    spec = StudySpec.from_dict(small_moe_study(objective=["tokens_per_s_per_gpu", "peak_memory_gib"]))
    assert spec.search.multi_objective


def test_missing_section_is_named():
    data = small_moe_study()
    del data["workload"]
    with pytest.raises(SpecError) as e:
        StudySpec.from_dict(data)
    assert "workload" in str(e.value) and "required" in str(e.value)


def test_not_a_mapping_and_bad_yaml(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: [unclosed\n")
    with pytest.raises(SpecError, match="not valid YAML"):
        StudySpec.from_yaml(p)
    p.write_text("- a\n- b\n")
    with pytest.raises(SpecError, match="mapping"):
        StudySpec.from_yaml(p)


def test_bad_yaml_names_the_line_and_column_on_one_line(tmp_path):
    p = tmp_path / "bad.yaml"
    p.write_text("name: x\n  model: 1\n")
    with pytest.raises(SpecError) as e:
        StudySpec.from_yaml(p)
    assert (
        str(e.value) == f"{p}:2:8: not valid YAML: mapping values are not allowed here; fix the syntax there"
    )


def _with_gpu(gpu):
    return StudySpec.from_dict(
        {**small_dense_study(), "cluster": {"gpu": gpu, "nodes": 1, "gpus_per_node": 8}}
    )


def test_hbm_gb_override_changes_the_capacity():
    from primus_optuna.physics import estimate_memory
    from primus_optuna.space import Space

    stock, nvl = _with_gpu("h100"), _with_gpu({"catalog": "h100", "hbm_gb": 94})
    assert nvl.cluster.gpu.hbm_gb == 94
    # scaled like the catalog's device-reported figure (79.6 GiB for 80 GB): 93.5 GiB, as nvidia-smi shows
    assert nvl.cluster.gpu.hbm_gib == pytest.approx(79.6 * 94 / 80)
    base = Space(nvl).baseline
    assert estimate_memory(nvl, base).capacity_gib == pytest.approx(nvl.cluster.gpu.hbm_gib)
    assert estimate_memory(stock, base).capacity_gib == pytest.approx(79.6)
    explicit = _with_gpu({"catalog": "h100", "hbm_gb": 94, "memory_gib": 90})
    assert explicit.cluster.gpu.hbm_gib == 90
    with pytest.raises(SpecError, match="hbm_gb"):
        _with_gpu({"catalog": "h100", "hbm_gb": -1})


def test_gpu_names_are_case_insensitive():
    assert _with_gpu("H100").cluster.gpu == _with_gpu("h100").cluster.gpu
    assert _with_gpu({"catalog": "MI300X"}).cluster.gpu.name == "mi300x"
    with pytest.raises(SpecError, match="GPU"):
        _with_gpu("H900")


@pytest.mark.parametrize(
    ("over", "message"),
    [
        ({"exp_avg_dtype": "bf16"}, "exp_avg_dtype: bf16 needs precision_aware_optimizer: true"),
        (
            {"main_params_dtype": "fp16", "exp_avg_sq_dtype": "fp8"},
            "main_params_dtype: fp16, exp_avg_sq_dtype: fp8 needs precision_aware_optimizer: true",
        ),
        (
            {"precision_aware_optimizer": True, "distributed_optimizer": False},
            "precision_aware_optimizer needs distributed_optimizer: true",
        ),
        (
            {"precision_aware_optimizer": True, "main_grads_dtype": "bf16"},
            "main_grads_dtype: bf16 needs grad_reduce_in_fp32: false",
        ),
        ({"precision_aware_optimizer": True, "main_params_dtype": "bf16"}, "workload.main_params_dtype"),
        ({"precision_aware_optimizer": True, "main_grads_dtype": "fp16"}, "workload.main_grads_dtype"),
    ],
)
def test_precision_aware_optimizer_legality_names_field_and_fix(over, message):
    """Megatron's rules (megatron/core/optimizer/optimizer_config.py, optimizer/__init__.py,
    training/arguments.py): lower-precision optimizer dtypes only with --use-precision-aware-optimizer, which
    only runs with the distributed optimizer; bf16 main grads are 2-byte gradients; the dtype choices are
    Megatron's argument choices."""
    data = small_moe_study()
    with pytest.raises(SpecError) as e:
        StudySpec.from_dict({**data, "workload": {**data["workload"], **over}})
    assert message in str(e.value)


def test_precision_aware_optimizer_accepts_the_published_recipe():
    data = small_moe_study()
    recipe = {
        "precision_aware_optimizer": True,
        "grad_reduce_in_fp32": False,
        "main_grads_dtype": "bf16",
        "exp_avg_dtype": "bf16",
        "exp_avg_sq_dtype": "bf16",
    }
    w = StudySpec.from_dict({**data, "workload": {**data["workload"], **recipe}}).workload
    assert (w.main_params_dtype, w.exp_avg_dtype, w.exp_avg_sq_dtype) == ("fp32", "bf16", "bf16")


def _nvidia_moe(**workload) -> dict:
    data = small_moe_study()
    data["cluster"] = {**data["cluster"], "gpu": "b200"}
    data["workload"] = {**data["workload"], **workload}
    return data


def test_te_op_fuser_defaults_off_and_is_accepted_on_an_nvidia_swiglu_moe():
    assert StudySpec.from_dict(_nvidia_moe()).workload.te_op_fuser is False
    assert StudySpec.from_dict(_nvidia_moe(te_op_fuser=True)).workload.te_op_fuser is True


@pytest.mark.parametrize(
    ("change", "message"),
    [
        # a dense MLP takes TEFusedMLP (gpt_layer_specs.py@d98e8a64:536-541), not the modelled grouped MLP
        ({"model": {"catalog": "llama3.1-8b"}}, "this model is dense"),
        # Megatron's fused grouped MLP needs a gated SiLU / quick-GELU expert MLP (experts.py@d98e8a64:415-428)
        ({"model": {"catalog": "mixtral-8x7b", "swiglu": False}}, "needs a gated (SwiGLU) expert MLP"),
        # the Megatron-LM that Primus pins (d3528a21) has no use_transformer_engine_op_fuser
        ({"cluster": {"gpu": "mi355x", "nodes": 2, "gpus_per_node": 4}}, "Primus pins (d3528a21)"),
    ],
)
def test_te_op_fuser_legality_names_the_field_and_the_fix(change, message):
    data = {**_nvidia_moe(te_op_fuser=True), **change}
    with pytest.raises(SpecError) as e:
        StudySpec.from_dict(data)
    text = str(e.value)
    assert message in text
    assert "workload.te_op_fuser" in text and "te_op_fuser: false" in text
    # off, the same study loads
    StudySpec.from_dict({**data, "workload": {**data["workload"], "te_op_fuser": False}})


def test_te_op_fuser_enters_the_space_hash_only_when_on():
    from primus_optuna.search.state import space_hash

    base = StudySpec.from_dict(_nvidia_moe())
    written_off = StudySpec.from_dict(_nvidia_moe(te_op_fuser=False))
    assert space_hash(base) == space_hash(written_off)
    assert space_hash(StudySpec.from_dict(_nvidia_moe(te_op_fuser=True))) != space_hash(base)


def test_model_fields_added_later_keep_older_study_hashes():
    """activation_func_clamp_value enters the space hash only when set: these are the hashes main gave before
    the field existed (c5aee92), for the small test studies and the flagship."""
    from primus_optuna.search.state import space_hash
    from tests.conftest import FLAGSHIP, small_dense_study, small_moe_study

    assert space_hash(StudySpec.from_dict(small_dense_study())) == "a5ff2ba3fc71c2cf"
    assert space_hash(StudySpec.from_dict(small_moe_study())) == "9045bbbbe49e17ab"
    assert space_hash(StudySpec.from_yaml(FLAGSHIP)) == "15d17afb3d72c6ea"
    data = small_moe_study()
    clamped = {**data, "model": {"catalog": data["model"]["catalog"], "activation_func_clamp_value": 7.0}}
    assert space_hash(StudySpec.from_dict(clamped)) != space_hash(StudySpec.from_dict(data))


def test_grace_blackwell_and_blackwell_ultra_catalog_entries(flagship_path) -> None:
    """GB200 / GB300 NVL72 and HGX B300 at their spec tables' dense figures (hardware.py's comment); an NVL72
    rack is one NVLink domain of up to 72 GPUs, i.e. one "node" of up to 72."""
    gb200, gb300, b300 = (GPUSpec.catalog(n) for n in ("GB200", "gb300", "b300"))
    assert (gb200.bf16_tflops, gb200.fp8_tflops, gb200.hbm_gb) == (2500, 5000, 186)
    assert (gb300.bf16_tflops, gb300.fp8_tflops, gb300.hbm_gb) == (2500, 5000, 288)
    assert (b300.bf16_tflops, b300.fp8_tflops, b300.hbm_gb) == (2250, 4500, 288)
    # no device-reported capacity on record: the datasheet GB converted to GiB
    assert gb300.hbm_gib == pytest.approx(288e9 / 2**30)
    # ConnectX-8 (800 Gb/s) on the Blackwell Ultra systems, ConnectX-7 (400 Gb/s) on GB200
    assert (gb200.inter_node_bw_gbs, gb300.inter_node_bw_gbs, b300.inter_node_bw_gbs) == (50, 100, 100)
    data = yaml.safe_load(flagship_path.read_text())
    data["cluster"] = {"gpu": "gb200", "nodes": 1, "gpus_per_node": 72}
    assert StudySpec.from_dict(data).world == 72


def test_dispatcher_names_from_recipes_point_to_deepep() -> None:
    """Megatron-Bridge / Primus recipes say flex, HybridEP or turbo: the error names the axis value to use."""
    from primus_optuna.spec.study import check_choice

    for name in ("flex", "HybridEP", "turbo"):
        with pytest.raises(SpecError, match="moe_dispatcher: .* use deepep"):
            check_choice("moe_dispatcher", name)
    with pytest.raises(SpecError) as e:
        check_choice("moe_dispatcher", "x")
    assert "use deepep" not in str(e.value)
    assert check_choice("moe_dispatcher", "deepep") == "deepep"


def _fp8_moe(**workload) -> dict:
    return _nvidia_moe(**{"precision": "fp8", "fp8_recipe": "mxfp8", **workload})


def test_fp8_dot_product_attention_defaults_off_and_is_accepted_under_fp8():
    assert StudySpec.from_dict(_fp8_moe()).workload.fp8_dot_product_attention is False
    w = StudySpec.from_dict(_fp8_moe(fp8_dot_product_attention=True)).workload
    assert w.fp8_dot_product_attention is True


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"precision": "bf16"}, "needs precision fp8"),
        # Megatron builds Float8BlockScaling without fp8_dpa (fp8_utils.py@d98e8a64:782-785)
        ({"fp8_recipe": "blockwise"}, "no effect under fp8_recipe blockwise"),
        ({"flash_attention": False}, "flash_attention is false"),
    ],
)
def test_fp8_dot_product_attention_legality_names_the_field_and_the_fix(change, message):
    data = _fp8_moe(fp8_dot_product_attention=True, **change)
    with pytest.raises(SpecError) as e:
        StudySpec.from_dict(data)
    text = str(e.value)
    assert message in text and "fp8_dot_product_attention" in text
    StudySpec.from_dict({**data, "workload": {**data["workload"], "fp8_dot_product_attention": False}})


def test_fp8_dot_product_attention_enters_the_space_hash_only_when_on():
    from primus_optuna.search.state import space_hash

    base = StudySpec.from_dict(_fp8_moe())
    assert space_hash(base) == space_hash(StudySpec.from_dict(_fp8_moe(fp8_dot_product_attention=False)))
    assert space_hash(StudySpec.from_dict(_fp8_moe(fp8_dot_product_attention=True))) != space_hash(base)


def test_fp8_output_proj_defaults_off_needs_mxfp8_and_enters_the_hash_only_when_on():
    """workload.fp8_output_proj (Megatron-Core TransformerConfig.fp8_output_proj): accepted under FP8 with the
    MXFP8 recipe, refused otherwise naming the field and the fix (Megatron raises:
    transformer_config.py@d98e8a64:1569-1575); study files without it keep their space hash."""
    from primus_optuna.search.state import space_hash

    base = StudySpec.from_dict(_fp8_moe())
    assert base.workload.fp8_output_proj is False
    assert StudySpec.from_dict(_fp8_moe(fp8_output_proj=True)).workload.fp8_output_proj is True
    for change in ({"precision": "bf16", "fp8_recipe": "delayed"}, {"fp8_recipe": "tensorwise"}):
        with pytest.raises(SpecError) as e:
            StudySpec.from_dict(_fp8_moe(fp8_output_proj=True, **change))
        assert "fp8_output_proj needs precision fp8 with fp8_recipe mxfp8" in str(e.value)
    assert space_hash(base) == space_hash(StudySpec.from_dict(_fp8_moe(fp8_output_proj=False)))
    assert space_hash(StudySpec.from_dict(_fp8_moe(fp8_output_proj=True))) != space_hash(base)


def test_more_gpus_per_node_than_the_fabric_joins_is_a_warning_not_an_error():
    data = small_dense_study()
    assert StudySpec.from_dict(data).cluster.warnings() == []
    data["cluster"] = {"gpu": "h100", "nodes": 1, "gpus_per_node": 32}
    (line,) = StudySpec.from_dict(data).cluster.warnings()
    assert line.startswith(
        "cluster.gpus_per_node: 32 h100 GPUs per node, but its NVLink domain joins at most 8"
    )
    assert "nodes: 4, gpus_per_node: 8" in line
    data["cluster"] = {"gpu": "mi355x", "nodes": 1, "gpus_per_node": 16}
    assert "a full mesh of 7 links per GPU joins at most 8" in StudySpec.from_dict(data).cluster.warnings()[0]
    data["cluster"] = {"gpu": "gb200", "nodes": 1, "gpus_per_node": 72}  # one NVL72 rack
    assert StudySpec.from_dict(data).cluster.warnings() == []


def _cluster(**cluster) -> dict:
    data = small_dense_study()
    data["cluster"] = {**data["cluster"], **cluster}
    return data


def test_gpus_per_host_defaults_to_the_gpus_tray_else_the_node():
    """A GB200/GB300 rack's host is a compute tray of 4 GPUs (18 trays per NVL72); elsewhere a node is a host."""
    gb = StudySpec.from_dict(_cluster(gpu="gb200", nodes=2, gpus_per_node=64)).cluster
    assert (gb.gpus_per_host, gb.host_gpus, gb.hosts, gb.world) == (None, 4, 32, 128)
    assert StudySpec.from_dict(_cluster(gpu="gb300", nodes=1, gpus_per_node=2)).cluster.host_gpus == 2
    h100 = StudySpec.from_dict(_cluster(gpu="h100", nodes=3, gpus_per_node=8)).cluster
    assert (h100.host_gpus, h100.hosts) == (8, 3)
    two = StudySpec.from_dict(_cluster(gpu="h100", nodes=3, gpus_per_node=8, gpus_per_host=2)).cluster
    assert (two.host_gpus, two.hosts, two.world) == (2, 12, 24)


@pytest.mark.parametrize(
    ("cluster", "message"),
    [
        (
            {"gpu": "h100", "gpus_per_node": 8, "gpus_per_host": 3},
            r"cluster.gpus_per_host: 3 GPUs per host do not",
        ),
        (
            {"gpu": "gb200", "gpus_per_node": 6},
            r"cluster.gpus_per_host: 4 GPUs per host \(the gb200 default\)",
        ),
        (
            {"gpu": "h100", "gpus_per_node": 8, "gpus_per_host": 16},
            r"cluster.gpus_per_host: 16 GPUs per host",
        ),
    ],
)
def test_a_node_must_be_whole_hosts(cluster: dict, message: str):
    with pytest.raises(SpecError, match=message + r".*divide cluster.gpus_per_node"):
        StudySpec.from_dict(_cluster(nodes=1, **cluster))


def test_gpus_per_host_keeps_the_space_hash():
    """Hosts only split a launch; the estimate and the space are the node's (the NVLink domain)."""
    from primus_optuna.search.state import space_hash

    base = space_hash(StudySpec.from_dict(_cluster(gpu="h100", nodes=2, gpus_per_node=8)))
    assert (
        space_hash(StudySpec.from_dict(_cluster(gpu="h100", nodes=2, gpus_per_node=8, gpus_per_host=4)))
        == base
    )


def test_capacity_section_targets_and_token_counts():
    from primus_optuna.spec.study import token_count

    assert token_count("1T") == 1e12 and token_count("300b") == 3e11 and token_count(1.5e12) == 1.5e12
    assert token_count("2_000M") == 2e9 and token_count("4 K") == 4e3
    for bad in ("1X", "0", "-1T", "T", "1e999"):
        with pytest.raises(ValueError, match="is not a token count"):
            token_count(bad)
    data = small_dense_study()
    data["capacity"] = {"gpus": [8, 16], "tokens": "1T", "days": 30, "prices": {"h100": 2.5}}
    cap = StudySpec.from_dict(data).capacity
    assert cap.tokens == 1e12 and cap.batch == "fixed" and cap.gpu == []
    assert StudySpec.from_dict(small_dense_study()).capacity is None
    for bad, message in [
        ({"gpus": [8], "tokens": "1X"}, "capacity.tokens: '1X' is not a token count"),
        ({"gpus": [8], "days": 3}, "days needs a token target; add capacity.tokens"),
        ({"gpus": []}, "capacity.gpus"),
        ({"gpus": [8], "batch": "weak"}, "capacity.batch"),
    ]:
        data["capacity"] = bad
        with pytest.raises(SpecError, match=re.escape(message)):
            StudySpec.from_dict(data)


def test_dp_shard_enters_the_space_hash_and_config_key_only_when_searched():
    from primus_optuna.search.state import space_hash
    from primus_optuna.space import Space

    base = StudySpec.from_dict(small_dense_study())
    written = small_dense_study()
    written["search"]["baseline"]["dp_shard"] = 1
    assert space_hash(StudySpec.from_dict(written)) == space_hash(base) == "a5ff2ba3fc71c2cf"
    assert space_hash(StudySpec.from_dict(small_dense_study(axes={"dp_shard": [1]}))) == space_hash(base)
    searched = StudySpec.from_dict(small_dense_study(axes={"dp_shard": [1, 2, 4]}))
    assert space_hash(searched) != space_hash(base)
    space = Space(searched)
    assert (
        space.baseline.key() == Space(base).baseline.key() == "tp2-pp2-ep1-cp1-vpp1-mbs1-none-alltoall-1f1b"
    )
    assert space.baseline.replace(dp_shard=2).key().endswith("-1f1b-dpshard2")
    assert {c.dp_shard for c in space.configs()} == {1, 2, 4}
    with pytest.raises(SpecError, match="dp_shard"):
        StudySpec.from_dict(small_dense_study(axes={"dp_shard": [0]}))


def test_the_study_file_reference_example_loads():
    """docs/study-file.md's annotated study (its first YAML block) is a study file that loads as written."""
    doc = (Path(__file__).resolve().parents[2] / "docs" / "study-file.md").read_text()
    block = re.search(r"```yaml\n(.*?)```", doc, re.S)
    assert block is not None
    spec = StudySpec.from_dict(yaml.safe_load(block.group(1)), base_dir="studies")
    assert spec.name == "mixtral-8x22b-mi355x-fp8" and spec.capacity is not None


def test_a_value_outside_its_choices_says_what_was_given():
    data = small_moe_study()
    data["workload"]["precision"] = "bf61"
    with pytest.raises(SpecError) as e:
        StudySpec.from_dict(data)
    assert "workload.precision: Input should be 'bf16', 'fp16' or 'fp8', got 'bf61'" in str(e.value)
