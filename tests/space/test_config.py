import dataclasses

from primus_optuna import Space, StudySpec, TrainingConfig
from primus_optuna.space.config import passes_checks, prechecked_config
from tests.conftest import FLAGSHIP


def test_prechecked_config_is_the_checked_configuration() -> None:
    space = Space(StudySpec.from_yaml(FLAGSHIP))
    names = [f.name for f in dataclasses.fields(TrainingConfig)]
    sample = space.configs()[::499]
    assert len({c.ep_overlap for c in sample}) == 2 and len({c.recompute for c in sample}) > 3
    for c in sample:
        values = [getattr(c, n) for n in names]
        checked, fast = TrainingConfig(*values), prechecked_config(*values)
        assert type(fast) is TrainingConfig
        assert fast == checked and hash(fast) == hash(checked) and repr(fast) == repr(checked)
        assert [getattr(fast, n) for n in names] == values


def test_passes_checks_only_values_stored_unchanged() -> None:
    assert passes_checks("recompute", "selective:moe_act") and passes_checks("ep_overlap", True)
    assert passes_checks("moe_dispatcher", "deepep") and passes_checks("tp", 4)
    assert not passes_checks("recompute", "selective:core_attn")  # stored as "selective"
    assert not passes_checks("moe_dispatcher", "nccl")
    assert not passes_checks("ep_overlap", 1)
