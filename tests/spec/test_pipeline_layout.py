"""Pipeline layouts: Megatron's layout string, first/last-stage counts, account-for-embedding/loss, the legality
rules that read them, and the export/import round trip."""

from __future__ import annotations

import pytest

from primus_optuna import Space, StudySpec
from primus_optuna.errors import SpecError
from primus_optuna.space.megatron_args import megatron_overrides
from primus_optuna.spec.layout import (
    PipelineSpec,
    chunks_or_reason,
    expand_layout,
    layout_string,
    pipeline_chunks,
)
from primus_optuna.spec.model import MODEL_CATALOG
from primus_optuna.spec.primus_import import pipeline_from_megatron

V3 = MODEL_CATALOG["deepseek-v3"]


def test_expand_megatron_layout_strings() -> None:
    chunks = expand_layout("Et*3|(tt|)*29m|L")
    assert len(chunks) == 32 and chunks[0] == "Ettt" and chunks[-2] == "m" and chunks[-1] == "L"
    assert expand_layout("Et*4|(t*4|)*14tmL")[-1] == "tmL"
    with pytest.raises(ValueError, match="unexpected"):
        expand_layout("Et*3|x|L")
    with pytest.raises(ValueError, match="unbalanced"):
        expand_layout("E(tt|L")


@pytest.mark.parametrize(
    ("layout", "pp", "vpp"),
    [("Et*3|(tt|)*29m|L", 8, 4), ("Et*4|(t*4|)*14tmL", 8, 2), ("Et|(tt|)*30mL", 8, 4)],
)
def test_published_deepseek_v3_layouts_place_every_layer(layout: str, pp: int, vpp: int) -> None:
    p = PipelineSpec(layout=layout)
    p.check_model(V3)
    chunks = pipeline_chunks(V3, p, pp, vpp)
    assert sum(c.decoder for c in chunks) == 61 and sum(c.moe for c in chunks) == 58
    assert sum(c.mtp for c in chunks) == 1 and chunks[0].embedding and chunks[-1].loss
    assert chunks[0].dense == min(chunks[0].decoder, 3)
    # the inverse writes the same placement
    again = pipeline_chunks(V3, PipelineSpec(layout=layout_string(chunks)), pp, vpp)
    assert again == chunks


def test_layout_must_match_the_model() -> None:
    with pytest.raises(ValueError, match="decoder layers"):
        PipelineSpec(layout="Et*3|tL").check_model(V3)
    with pytest.raises(ValueError, match="MTP"):
        PipelineSpec(layout="Et*30|t*31L").check_model(V3)
    with pytest.raises(ValueError, match="embedding"):
        PipelineSpec(layout="t*30|Et*31mL")


def test_first_last_and_account_for_splits() -> None:
    p = PipelineSpec(decoder_first_pipeline_num_layers=5, decoder_last_pipeline_num_layers=2)
    chunks = pipeline_chunks(V3, p, 8, 1)  # 5 | 9 x 6 | 2
    assert [c.decoder for c in chunks] == [5] + [9] * 6 + [2]
    assert chunks[-1].mtp == 1
    acc = PipelineSpec(account_for_embedding_in_pipeline_split=True, account_for_loss_in_pipeline_split=True)
    chunks = pipeline_chunks(V3, acc, 7, 3)  # 63 slots over 21 chunks
    assert chunks[0].decoder == 2 and chunks[-1].decoder == 2 and sum(c.decoder for c in chunks) == 61
    chunks, reason = chunks_or_reason(V3, PipelineSpec(), 8, 1)
    assert chunks is None and "61 layers" in reason


def _v3_study(pipeline: dict | None = None) -> StudySpec:
    data = {
        "name": "v3",
        "model": {"catalog": "deepseek-v3"},
        "cluster": {"gpu": "mi355x", "nodes": 8},
        "workload": {"seq_length": 4096, "global_batch_size": 1024, "precision": "fp8"},
    }
    if pipeline is not None:
        data["pipeline"] = pipeline
    return StudySpec.from_dict(data)


def test_rules_read_the_layout() -> None:
    space = Space(_v3_study({"layout": "Et*4|(t*4|)*14tmL"}))
    ok = space.make(pp=8, vpp=2, ep=8, pp_schedule="interleaved")
    assert space.check(ok) == []
    bad = space.check(space.make(pp=4, vpp=2, ep=8, pp_schedule="interleaved"))
    assert any("pp·vpp" in r for r in bad)
    assert any("does not divide the 16 chunks" in r for r in space.check(space.make(pp=3, ep=1)))
    plain = Space(_v3_study())
    assert any("61 layers" in r for r in plain.check(plain.make(pp=8, ep=8)))


def test_bad_layout_is_one_spec_error() -> None:
    with pytest.raises(SpecError, match="pipeline"):
        _v3_study({"layout": "Et*3|tL"})


def test_export_and_import_speak_the_same_form() -> None:
    spec = _v3_study({"layout": "Et*4|(t*4|)*14tmL"})
    cfg = Space(spec).make(pp=8, vpp=2, ep=8, pp_schedule="interleaved").derive(64, 1024)
    args = megatron_overrides(spec, cfg)
    assert args["pipeline_model_parallel_layout"] == "Et*4|(t*4|)*14tmL"
    assert PipelineSpec(**pipeline_from_megatron(args)) == spec.pipeline
    spec2 = _v3_study({"decoder_first_pipeline_num_layers": 5, "decoder_last_pipeline_num_layers": 2})
    args2 = megatron_overrides(spec2, Space(spec2).make(pp=8, ep=8).derive(64, 1024))
    assert PipelineSpec(**pipeline_from_megatron(args2)) == spec2.pipeline


def test_primus_overlay_with_a_layout_imports_as_the_same_study(tmp_path) -> None:
    """A Primus experiment written for a layout study reads back as a study with that pipeline section and
    the MLA / MoE model fields (Megatron names)."""
    import yaml

    from primus_optuna.run.presets import primus_overlay
    from primus_optuna.spec.primus_import import import_primus_yaml

    spec = _v3_study({"layout": "Et*4|(t*4|)*14tmL"})
    space = Space(spec)
    config = space.canonical(space.make(pp=8, vpp=2, ep=8, pp_schedule="interleaved"))
    model_args = {k: v for k, v in spec.model.model_dump().items() if k != "name" and v is not None}
    (tmp_path / "deepseek_v3.yaml").write_text(yaml.safe_dump(model_args))
    experiment = {"modules": {"pre_trainer": {"model": "deepseek_v3.yaml", "overrides": {"train_iters": 5}}}}
    path = tmp_path / "overlay.yaml"
    path.write_text(yaml.safe_dump(primus_overlay(spec, config, experiment=experiment)))
    info = import_primus_yaml(path)
    assert info.overrides["pipeline_model_parallel_layout"] == "Et*4|(t*4|)*14tmL"
    data = {
        "name": "again",
        "model": {"primus_yaml": str(path)},
        "cluster": {"gpu": "mi355x", "nodes": 8},
        "workload": {"precision": "fp8"},
    }
    again = StudySpec.from_dict(data)
    assert again.pipeline == spec.pipeline
    assert again.model.model_dump(exclude={"name"}) == spec.model.model_dump(exclude={"name"})
    assert Space(again).canonical(Space(again).baseline) == config


def test_tp_must_divide_mla_heads_and_the_shared_expert_width() -> None:
    data = {
        "name": "lite",
        "model": {"catalog": "deepseek-v2-lite", "moe_shared_expert_intermediate_size": 2820},
        "cluster": {"gpu": "h100", "nodes": 2},
        "workload": {"seq_length": 4096, "global_batch_size": 64},
        "search": {"max_tp": 16},
    }
    space = Space(StudySpec.from_dict(data))
    assert space.check(space.make(tp=4, ep=1)) == []
    assert any("moe_shared_expert_intermediate_size=2820" in r for r in space.check(space.make(tp=8, ep=1)))
    heads = dict(data, model={"catalog": "deepseek-v2-lite", "num_attention_heads": 12})
    space = Space(StudySpec.from_dict(heads))
    assert any("12 attention heads" in r for r in space.check(space.make(tp=8, ep=1)))
