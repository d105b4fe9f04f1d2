"""Import the model, workload and baseline of a study from a Primus (or plain Megatron) workload YAML.

A study may say ``model: {primus_yaml: path/to/experiment.yaml}``. The file is either

- a Primus *experiment* (``modules.pre_trainer`` with ``framework``, ``model: <model yaml>`` and
  ``overrides``): the model YAML is looked up next to the experiment, under ``primus_root`` (or a Primus
  checkout above the experiment) in ``primus/configs/models/<framework>/``; or
- a model/argument YAML itself (Megatron names at the top level).

Each file's ``extends:`` chain is followed (paths relative to that file; later files override earlier ones;
Primus's ``${NAME:default}`` values resolved as Primus resolves them: :mod:`.primus_env`). The experiment's overrides
win over the model file. They also give the study its **baseline** (``tensor_model_parallel_size`` …
``micro_batch_size``, recompute, DeepEP and zero-bubble switches) when ``search.baseline`` is not written, and
``seq_length``/``global_batch_size``/precision and the memory levers (``grad_reduce_in_bf16`` or bf16
``main_grads_dtype``: 2-byte gradients; the FP8 recipe and ``fp8_param_gather``; the precision-aware optimizer
and its dtypes)
when ``workload`` leaves them out. With FSDP on (``use_torch_fsdp2``; ``use_megatron_fsdp`` with
``optim_grads_params``) the baseline's ``dp_shard`` is the data-parallel group over its HSDP replicas
(:func:`fsdp_replicas`), on the study's cluster. Other keys under ``model:``
override the imported architecture (e.g. ``vocab_size`` when the YAML names only a tokenizer).

Example::

    info = import_primus_yaml("examples/megatron/configs/MI300X/mixtral_8x22B_v0.1-FP8-pretrain.yaml")
    info.model["num_layers"], info.baseline["pp"]  # (56, 4)
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from ..errors import SpecError
from .axes import AXIS_LIST
from .hardware import GPUS_PER_NODE
from .layout import expand_layout
from .optimizer import OPTIMIZER_DTYPE_FIELDS
from .primus_env import resolve_primus_env
from .recompute import recompute_from_megatron

MODEL_KEYS: tuple[str, ...] = (
    "num_layers",
    "hidden_size",
    "ffn_hidden_size",
    "num_attention_heads",
    "num_query_groups",
    "kv_channels",
    "vocab_size",
    "num_experts",
    "moe_router_topk",
    "moe_ffn_hidden_size",
    "swiglu",
    "untie_embeddings_and_output_weights",
    "normalization",
    "position_embedding_type",
    "multi_latent_attention",
    "q_lora_rank",
    "kv_lora_rank",
    "qk_head_dim",
    "qk_pos_emb_head_dim",
    "v_head_dim",
    "moe_shared_expert_intermediate_size",
    "moe_layer_freq",
    "moe_router_num_groups",
    "moe_router_group_topk",
    "mtp_num_layers",
    "window_size",
    "window_attn_skip_freq",
    "softmax_type",
    "add_bias_linear",
    "add_qkv_bias",
    "activation_func_clamp_value",
)
"""Megatron argument names that are :class:`~primus_optuna.spec.ModelSpec` fields of the same name."""

TOKENIZER_VOCAB: tuple[tuple[str, int], ...] = (
    ("llama-3", 128256),
    ("llama3", 128256),
    ("llama-2", 32000),
    ("llama2", 32000),
    ("mixtral", 32000),
    ("mistral", 32000),
    ("qwen", 151936),
    ("deepseek", 129280),
)
"""Vocabulary sizes of well-known tokenizers (Hugging Face configs), for YAMLs that name only a tokenizer."""


@dataclass
class PrimusImport:
    """What a Primus/Megatron YAML says about a study."""

    model: dict[str, Any]
    baseline: dict[str, Any]
    workload: dict[str, Any]
    overrides: dict[str, Any] = field(default_factory=dict)
    """the merged Megatron arguments (model file chain, then the experiment's overrides)"""
    files: list[str] = field(default_factory=list)
    """every file read, in merge order"""
    fsdp_replicas: int | None = None
    """with FSDP (ZeRO-3) on, the replicas of the sharded group (HSDP; 1: FSDP over the whole data-parallel
    group): :func:`fsdp_replicas`; the baseline's ``dp_shard`` is dp / replicas once the cluster is known"""


def _read(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise SpecError(f"model.primus_yaml: file {str(path)!r} not found")
    try:
        doc = yaml.safe_load(path.read_text())
    except yaml.YAMLError as exc:
        raise SpecError(f"model.primus_yaml: {path} is not valid YAML: {exc}") from None
    if doc is None:
        return {}
    if not isinstance(doc, dict):
        raise SpecError(f"model.primus_yaml: {path} must hold a mapping")
    return doc


def load_with_extends(
    path: str | Path, _seen: tuple[Path, ...] = (), files: list[str] | None = None
) -> dict[str, Any]:
    """The mapping of ``path`` with its ``extends:`` chain merged (bases first, this file last)."""
    p = Path(path).resolve()
    if p in _seen:
        raise SpecError(f"model.primus_yaml: 'extends' cycle: {' -> '.join(str(x) for x in (*_seen, p))}")
    # every value resolved before the extends are merged, as Primus's loader does (yaml_loader.py@fd1eeabb:23-24)
    doc = resolve_primus_env(_read(p), where=f"model.primus_yaml: {p}: ")
    bases = doc.pop("extends", None) or []
    if isinstance(bases, str):
        bases = [bases]
    merged: dict[str, Any] = {}
    for base in bases:
        merged = _merge(merged, load_with_extends(p.parent / str(base), (*_seen, p), files))
    if files is not None:
        files.append(str(p))
    return _merge(merged, doc)


def _merge(base: dict[str, Any], over: dict[str, Any]) -> dict[str, Any]:
    out = dict(base)
    for k, v in over.items():
        out[k] = _merge(out[k], v) if isinstance(v, dict) and isinstance(out.get(k), dict) else v
    return out


def _find_model_file(name: str, experiment: Path, framework: str, primus_root: Path | None) -> Path:
    rel = Path("primus") / "configs" / "models" / framework / name
    candidates = [experiment.parent / name]
    if primus_root is not None:
        candidates += [primus_root / rel, primus_root / name]
    candidates += [parent / rel for parent in experiment.resolve().parents]
    for c in candidates:
        if c.is_file():
            return c
    raise SpecError(
        f"model.primus_yaml: the experiment's model file {name!r} was not found next to {experiment} nor in "
        f"{rel} of a Primus checkout; set model.primus_root to the Primus directory"
    )


def _truthy(v: Any) -> bool:
    return v.strip().lower() in ("1", "true", "yes", "on") if isinstance(v, str) else bool(v)


def _recompute_from_layer_ids(ids: Any, per_chunk: int | None) -> str:
    """Primus ``recompute_layer_ids`` (global layer ids, full granularity) as ``full`` / ``full:N``: exact
    when the ids are the first N layers of every virtual chunk; otherwise N = the most ids any chunk holds
    (the memory of the chunk that recomputes least is over-, the step time under-estimated: an
    approximation, since the axis speaks Megatron's block method)."""
    if isinstance(ids, str):
        ids = [x for x in ids.replace(",", " ").replace("[", " ").replace("]", " ").split()]
    try:
        layer_ids = sorted({int(x) for x in ids})
    except (TypeError, ValueError):
        raise SpecError(f"recompute_layer_ids: {ids!r} is not a list of layer numbers") from None
    if not per_chunk:
        raise SpecError("recompute_layer_ids needs num_layers to place the layers in pipeline chunks")
    counts: dict[int, list[int]] = {}
    for i in layer_ids:
        counts.setdefault(i // per_chunk, []).append(i % per_chunk)
    n = max(len(v) for v in counts.values())
    return "full" if n >= per_chunk else f"full:{n}"


def baseline_from_megatron(args: dict[str, Any]) -> dict[str, Any]:
    """The ten axes (as ``search.baseline``) that Megatron/Primus arguments select; absent ones are defaults."""

    def get(name: str, default: Any = None) -> Any:
        v = args.get(name)
        return default if v is None else v

    pp = int(get("pipeline_model_parallel_size", 1))
    vpp = get("num_virtual_stages_per_pipeline_rank", get("virtual_pipeline_model_parallel_size"))
    layout = get("pipeline_model_parallel_layout")
    if (
        vpp is None and layout and pp > 1
    ):  # a layout fixes vpp (megatron/training/arguments.py@d98e8a64:941-952)
        vpp = max(1, len(expand_layout(str(layout))) // pp)
    if vpp is None and get("num_layers_per_virtual_pipeline_stage") and get("num_layers"):
        vpp = int(get("num_layers")) // (pp * int(get("num_layers_per_virtual_pipeline_stage")))
    vpp = int(vpp or 1)
    if _truthy(get("zero_bubble_v_schedule", False)):
        schedule = "zbv"
    elif _truthy(get("enable_zero_bubble", False)) or _truthy(get("patch_zero_bubble", False)):
        schedule = "zb1p"
    else:
        schedule = "interleaved" if vpp > 1 else "1f1b"
    layers = get("num_layers")
    per_chunk = int(layers) // (pp * vpp) if layers else None
    ids = get("recompute_layer_ids")
    if ids not in (None, "", []):
        recompute = _recompute_from_layer_ids(ids, per_chunk)
    else:
        recompute = recompute_from_megatron(
            get("recompute_granularity"),
            get("recompute_method"),
            get("recompute_num_layers"),
            get("recompute_modules"),
            per_chunk,
        )
    deepep = get("moe_token_dispatcher_type") == "flex" or any(
        _truthy(get(k, False)) for k in ("moe_enable_deepep", "use_turbo_deepep")
    )
    sizes = {  # the sizes read as they are written (pp and vpp from the layout above)
        a.name: int(get(a.primus, a.default))
        for a in AXIS_LIST
        if a.kind == "int" and a.primus and a.name not in ("pp", "vpp")
    }
    return sizes | {
        "pp": pp,
        "vpp": vpp,
        "recompute": recompute,
        "moe_dispatcher": "deepep" if deepep else "alltoall",
        "pp_schedule": schedule,
        "ep_overlap": _truthy(get("overlap_moe_expert_parallel_comm", False)),
    }


def fsdp_replicas(args: dict[str, Any]) -> int | None:
    """The replicas of the FSDP-sharded group when the arguments turn on ZeRO-3 sharding, else None.

    - ``use_torch_fsdp2``: torch FSDP2 over the data-parallel (with context) group, or HSDP over
      ``data_parallel_replicate_degree`` replicas (Primus's torch FSDP2 wrapper,
      primus/backends/megatron/core/distributed/torch_fully_sharded_data_parallel.py@fd1eeabb:110-131;
      Megatron's, megatron/core/distributed/torch_fully_sharded_data_parallel.py@d98e8a64:76-81);
    - ``use_megatron_fsdp`` (or its old name ``use_custom_fsdp``) with ``data_parallel_sharding_strategy:
      optim_grads_params`` (parameters, gradients and optimizer state sharded; Megatron's default,
      megatron/training/arguments.py@d98e8a64:3190; Primus's ``no_shard``, primus/configs/modules/megatron/
      trainer_base.yaml@fd1eeabb:189, when the strategy is not written), HSDP over
      ``num_distributed_optimizer_instances`` replicas (megatron/core/distributed/fsdp/mcore_fsdp_adapter.py@
      d98e8a64:346). ``optim``/``optim_grads`` (ZeRO-1/2) are not ZeRO-3: None.
    """
    if _truthy(args.get("use_torch_fsdp2", False)):
        return max(1, int(args.get("data_parallel_replicate_degree") or 1))
    megatron_fsdp = _truthy(args.get("use_megatron_fsdp", False)) or _truthy(
        args.get("use_custom_fsdp", False)
    )
    if (
        megatron_fsdp
        and str(args.get("data_parallel_sharding_strategy") or "no_shard") == "optim_grads_params"
    ):
        return max(1, int(args.get("num_distributed_optimizer_instances") or 1))
    return None


def baseline_dp_shard(baseline: dict[str, Any], replicas: int, world: int) -> int:
    """``dp_shard`` of an imported FSDP baseline on ``world`` GPUs: the data-parallel group (world over
    tp·pp·cp) over its replicas; 1 (the distributed optimizer) where they do not divide."""
    inner = int(baseline.get("tp", 1)) * int(baseline.get("pp", 1)) * int(baseline.get("cp", 1))
    dp = world // inner if world % inner == 0 else 0
    return dp // replicas if dp and dp % replicas == 0 and dp > 1 else 1


def model_from_megatron(args: dict[str, Any], name: str) -> dict[str, Any]:
    """:class:`ModelSpec` fields from Megatron arguments (vocab from the tokenizer name when absent)."""
    out: dict[str, Any] = {"name": name}
    for k in MODEL_KEYS:
        if args.get(k) is not None:
            out[k] = args[k]
    if args.get("group_query_attention") is False and "num_query_groups" in out:
        del out["num_query_groups"]
    if "ffn_hidden_size" not in out and "hidden_size" in out:
        out["ffn_hidden_size"] = 4 * int(out["hidden_size"])
    if "vocab_size" not in out:
        tok = str(args.get("tokenizer_model") or "").lower()
        for key, vocab in TOKENIZER_VOCAB:
            if key in tok:
                out["vocab_size"] = vocab
                break
    if (out.get("num_experts") or 1) <= 1:
        out.pop("num_experts", None)
        out.pop("moe_router_topk", None)
        out.pop("moe_ffn_hidden_size", None)
    return out


PIPELINE_KEYS: dict[str, str] = {
    "pipeline_model_parallel_layout": "layout",
    "decoder_first_pipeline_num_layers": "decoder_first_pipeline_num_layers",
    "decoder_last_pipeline_num_layers": "decoder_last_pipeline_num_layers",
    "account_for_embedding_in_pipeline_split": "account_for_embedding_in_pipeline_split",
    "account_for_loss_in_pipeline_split": "account_for_loss_in_pipeline_split",
}
"""Megatron pipeline-split arguments -> the study's ``pipeline`` section."""


def pipeline_from_megatron(args: dict[str, Any]) -> dict[str, Any]:
    """The study's ``pipeline`` section from Megatron arguments (empty when the split is even)."""
    out: dict[str, Any] = {}
    for key, field_name in PIPELINE_KEYS.items():
        value = args.get(key)
        if value is None or value is False:
            continue
        out[field_name] = _truthy(value) if key.startswith("account_for") else value
    return out


def workload_from_megatron(args: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    if args.get("seq_length"):
        out["seq_length"] = int(args["seq_length"])
    if args.get("global_batch_size"):
        out["global_batch_size"] = int(args["global_batch_size"])
    if args.get("fp8"):
        out["precision"] = "fp8"
    elif _truthy(args.get("fp16", False)):
        out["precision"] = "fp16"
    elif "bf16" in args:
        out["precision"] = "bf16"
    if "use_distributed_optimizer" in args and args["use_distributed_optimizer"] is not None:
        out["distributed_optimizer"] = _truthy(args["use_distributed_optimizer"])
    # --sequence-parallel when written (Primus's language_model.yaml sets it true; the study default is true);
    # at TP 1 Megatron turns it off anyway (arguments.py@d98e8a64:1430-1439), so it says nothing there
    tp = int(args.get("tensor_model_parallel_size") or 1)
    if tp > 1 and args.get("sequence_parallel") is not None and not _truthy(args["sequence_parallel"]):
        out["sequence_parallel"] = False
    # --use-transformer-engine-op-fuser (upstream Megatron-LM only: transformer_config.py@d98e8a64:525-527)
    if _truthy(args.get("use_transformer_engine_op_fuser", False)):
        out["te_op_fuser"] = True
    if out.get("precision") == "fp8" and args.get("fp8_recipe"):
        # --fp8-recipe (delayed, Megatron's default, when absent; a value the study cannot price, such as
        # custom, is refused by the workload's validation naming the field)
        out["fp8_recipe"] = str(args["fp8_recipe"]).strip().lower()
    if out.get("precision") == "fp8" and _truthy(args.get("fp8_param_gather", False)):
        out["fp8_param_gather"] = True
    # --fp8-output-proj (upstream Megatron-LM only: transformer_config.py@d98e8a64:635)
    if out.get("precision") == "fp8" and _truthy(args.get("fp8_output_proj", False)):
        out["fp8_output_proj"] = True
    # Megatron-Core's precision-aware optimizer (megatron/training/arguments.py); its dtypes are legal only with
    # it (OptimizerConfig.__post_init__), so they are read only when it is on
    if _truthy(args.get("use_precision_aware_optimizer", False)):
        out["precision_aware_optimizer"] = True
        for name in OPTIMIZER_DTYPE_FIELDS:
            if args.get(name) is not None:
                out[name] = str(args[name]).strip().lower()
    # bf16 gradients: --grad-reduce-in-bf16, or bf16 main grads, which make Megatron accumulate and reduce in
    # bf16 (arguments.py: accumulate_allreduce_grads_in_fp32 is forced on only while main_grads_dtype is fp32)
    if _truthy(args.get("grad_reduce_in_bf16", False)) or out.get("main_grads_dtype") == "bf16":
        out["grad_reduce_in_fp32"] = False
    return out


def import_primus_yaml(path: str | Path, primus_root: str | Path | None = None) -> PrimusImport:
    """Read a Primus experiment (or model/argument) YAML with its ``extends`` chains."""
    p = Path(path)
    files: list[str] = []
    doc = load_with_extends(p, files=files)
    modules = doc.get("modules")
    if isinstance(modules, dict) and modules:
        trainer = modules.get("pre_trainer") or next(iter(modules.values()))
        if not isinstance(trainer, dict):
            raise SpecError(f"model.primus_yaml: {p}: modules.pre_trainer must be a mapping")
        overrides = trainer.get("overrides") or {}
        model_args: dict[str, Any] = {}
        name = p.stem
        if trainer.get("model"):
            root = Path(primus_root) if primus_root else None
            model_file = _find_model_file(
                str(trainer["model"]), p, str(trainer.get("framework", "megatron")), root
            )
            model_args = load_with_extends(model_file, files=files)
            name = model_file.stem
        args = _merge(model_args, overrides)
    else:
        args, name = doc, p.stem
    return PrimusImport(
        model=model_from_megatron(args, name),
        baseline=baseline_from_megatron(args),
        workload=workload_from_megatron(args),
        overrides=args,
        files=files,
        fsdp_replicas=fsdp_replicas(args),
    )


def expand_primus_study(data: dict[str, Any], base_dir: str | Path = ".") -> dict[str, Any]:
    """A study dict with ``model: {primus_yaml: ...}`` replaced by the imported model; ``search.baseline``
    and missing ``workload`` keys filled from the YAML (what the study file writes always wins)."""
    model = dict(data["model"])
    path = Path(str(model.pop("primus_yaml")))
    root = model.pop("primus_root", None)
    base = Path(base_dir)
    if not path.is_absolute():
        path = base / path
    if root is not None and not Path(str(root)).is_absolute():
        root = base / str(root)
    info = import_primus_yaml(path, root)
    out = dict(data)
    out["model"] = {**info.model, **model}
    if isinstance(data.get("workload"), dict):
        out["workload"] = {**info.workload, **data["workload"]}
    elif "workload" not in data and info.workload:
        out["workload"] = info.workload
    pipeline = pipeline_from_megatron(info.overrides)
    if pipeline and "pipeline" not in data:
        out["pipeline"] = pipeline
    search = dict(data.get("search") or {})
    if "baseline" not in search:
        baseline = dict(info.baseline)
        cluster = data.get("cluster")
        if info.fsdp_replicas and isinstance(cluster, dict) and "nodes" in cluster:
            world = int(cluster["nodes"]) * int(cluster.get("gpus_per_node", GPUS_PER_NODE))
            baseline["dp_shard"] = baseline_dp_shard(baseline, info.fsdp_replicas, world)
        search["baseline"] = baseline
        out["search"] = search
    return out
