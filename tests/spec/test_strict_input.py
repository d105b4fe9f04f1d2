"""Strict study-file input (#22 item 7): sizes are integers, unreadable files and unsupported architectures
are one named error each."""

import json

import pytest
import yaml

from primus_optuna import SpecError, StudySpec
from tests.conftest import small_dense_study, small_moe_study


@pytest.mark.parametrize("value", [True, "4096", 4096.0])
def test_sizes_are_strict_integers(value):
    data = small_dense_study()
    data["workload"]["seq_length"] = value
    with pytest.raises(SpecError) as e:
        StudySpec.from_dict(data)
    assert "workload.seq_length" in str(e.value) and "integer" in str(e.value)


def test_model_and_baseline_integers_are_strict():
    data = small_dense_study()
    data["model"] = {"catalog": "llama3.1-8b", "num_layers": True}
    with pytest.raises(SpecError, match="model.num_layers: must be an integer"):
        StudySpec.from_dict(data)
    data = small_dense_study()
    data["search"]["baseline"]["tp"] = "2"
    with pytest.raises(SpecError, match="search.baseline.tp: must be an integer"):
        StudySpec.from_dict(data)
    data = small_dense_study()
    data["cluster"]["nodes"] = False
    with pytest.raises(SpecError, match="cluster.nodes: must be an integer"):
        StudySpec.from_dict(data)


def test_non_utf8_study_file_is_one_error(tmp_path):
    p = tmp_path / "s.yaml"
    p.write_bytes(yaml.safe_dump(small_dense_study()).encode() + b"# caf\xe9\n")
    with pytest.raises(SpecError, match="not a UTF-8 text file"):
        StudySpec.from_yaml(p)


def test_hf_config_directory_is_one_error(tmp_path):
    (tmp_path / "model").mkdir()
    data = small_dense_study()
    data["model"] = {"hf_config": "model"}
    with pytest.raises(SpecError, match="is a directory; give the path of its config.json"):
        StudySpec.from_dict(data, base_dir=tmp_path)


def test_unsupported_architecture_is_refused_by_name(tmp_path):
    cfg = {"model_type": "mamba", "num_hidden_layers": 64, "hidden_size": 2560, "vocab_size": 50280}
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    data = small_dense_study()
    data["model"] = {"hf_config": "config.json"}
    with pytest.raises(SpecError) as e:
        StudySpec.from_dict(data, base_dir=tmp_path)
    assert "model_type 'mamba' is not supported" in str(e.value) and "llama" in str(e.value)


def test_recompute_value_that_does_not_apply_is_refused_by_name():
    from primus_optuna import Space

    spec = StudySpec.from_dict(small_dense_study(axes={"recompute": ["none", "selective:moe"]}))
    with pytest.raises(SpecError) as e:
        Space(spec)
    assert "search.axes.recompute: 'selective:moe' does not apply to" in str(e.value)
    assert "no MoE layers" in str(e.value)
    data = small_moe_study()
    data["search"]["baseline"]["recompute"] = "selective:mla_up_proj"
    with pytest.raises(SpecError, match="search.baseline.recompute: 'selective:mla_up_proj' does not apply"):
        Space(StudySpec.from_dict(data))


def test_a_key_repeated_in_one_section_is_one_error_naming_it(tmp_path):
    text = yaml.safe_dump(small_dense_study(), sort_keys=False)
    p = tmp_path / "s.yaml"
    # plain YAML keeps the last value silently; a study file says which key and where
    p.write_text(text.replace("workload:\n", "workload:\n  seq_length: 2048\n", 1))
    with pytest.raises(
        SpecError, match=r"key 'seq_length' appears twice in the same section \(first on line"
    ):
        StudySpec.from_yaml(p)
    # the same key in different sections, and a merge key overridden, are fine
    base = small_dense_study()
    p.write_text(
        "x-workload: &w "
        + json.dumps(base["workload"])
        + "\n"
        + yaml.safe_dump({k: v for k, v in base.items() if k != "workload"}, sort_keys=False)
        + f"workload:\n  <<: *w\n  seq_length: {base['workload']['seq_length'] * 2}\n"
    )
    with pytest.raises(SpecError, match="x-workload: unknown key"):  # the anchor's holder, not a duplicate
        StudySpec.from_yaml(p)


def test_hf_config_without_intermediate_size_is_one_error(tmp_path):
    cfg = {
        "model_type": "llama",
        "num_hidden_layers": 2,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "vocab_size": 1000,
    }
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    data = small_dense_study()
    data["model"] = {"hf_config": "config.json"}
    with pytest.raises(SpecError, match=r"missing keys \['intermediate_size'\]"):
        StudySpec.from_dict(data, base_dir=tmp_path)
    cfg["intermediate_size"] = 688
    (tmp_path / "config.json").write_text(json.dumps(cfg))
    assert StudySpec.from_dict(data, base_dir=tmp_path).model.ffn_hidden_size == 688


@pytest.mark.parametrize(("field", "value"), [("global_batch_size", 10**30), ("seq_length", 2**40)])
def test_absurd_workload_sizes_are_refused_with_their_bound(field, value):
    """Issue 39 item 12: a global batch of 10^30 or a sequence of 2^40 tokens is a typo, refused by name."""
    data = small_moe_study()
    data["workload"][field] = value
    with pytest.raises(SpecError, match=rf"workload\.{field}: must be <= 16777216, got {value}"):
        StudySpec.from_dict(data)
    data["workload"][field] = 2**24
    assert getattr(StudySpec.from_dict(data).workload, field) == 2**24
