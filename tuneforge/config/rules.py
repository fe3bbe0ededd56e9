"""Cross-field rules, checked once every section they read has validated on its own."""

from collections.abc import Callable
from typing import Any

from tuneforge.config.errors import ConfigIssue
from tuneforge.config.validation_messages import nearest_location
from tuneforge.config.yaml_source import SourceMap

Rule = Callable[..., list[tuple[str, str, str]]]
RULES: list[tuple[tuple[str, ...], Rule]] = []


def model_split_refused(parallel, why: str) -> list[tuple[str, str, str]]:
    """Tensor and expert parallelism refused by an objective, for `why` (a sentence)."""
    return [
        (
            f"parallel.{field}",
            why,
            f"drop parallel.{field} (FSDP2 shards the model across the ranks)",
        )
        for field in ("tensor_parallel", "expert_parallel")
        if getattr(parallel, field) > 1
    ]


def rule(*sections: str) -> Callable[[Rule], Rule]:
    """Register a rule that needs the named sections; it returns (path, message, fix) triples."""

    def register(check: Rule) -> Rule:
        RULES.append((sections, check))
        return check

    return register


def check_rules(sections: dict[str, Any], source_map: SourceMap) -> list[ConfigIssue]:
    issues = []
    for needed, check in RULES:
        if all(name in sections for name in needed):
            for path, message, fix in check(*(sections[name] for name in needed)):
                key_path = tuple(int(p) if p.isdigit() else p for p in path.split("."))
                issues.append(
                    ConfigIssue(path, message, fix, nearest_location(key_path, source_map))
                )
    return issues


@rule("model")
def model_source(model) -> list[tuple[str, str, str]]:
    if model.name is None and model.path is None:
        return [
            (
                "model",
                "set exactly one of model.name and model.path",
                "model.name builds a catalog shape with random weights; model.path loads a local HF directory",
            )
        ]
    if model.name is not None and model.path is not None:
        # each reported where it is set: one of them often comes from an `extends` file
        fix = "keep one: model.name builds a catalog shape, model.path loads a model directory"
        return [
            ("model.name", f"model.name ({model.name}) is set, and model.path too", fix),
            ("model.path", f"model.path ({model.path}) is set, and model.name too", fix),
        ]
    return []


@rule("model", "tokenizer")
def tokenizer_source(model, tokenizer) -> list[tuple[str, str, str]]:
    if tokenizer.path is None and model.path is None:
        return [
            (
                "tokenizer.path",
                "no tokenizer: a catalog shape (model.name) has none of its own",
                "set tokenizer.path to a local tokenizer directory",
            )
        ]
    return []


@rule("train")
def run_length(train) -> list[tuple[str, str, str]]:
    problems = []
    if train.max_steps is None and train.epochs is None:
        problems.append(
            ("train.max_steps", "the run has no length", "set train.max_steps or train.epochs")
        )
    if train.offload_checkpoints and train.activation_checkpointing == "none":
        problems.append(
            (
                "train.offload_checkpoints",
                "there is no checkpointed block whose input could be offloaded",
                "set train.activation_checkpointing: full (or selective)",
            )
        )
    if train.min_lr > train.lr:
        problems.append(
            ("train.min_lr", f"min_lr {train.min_lr} exceeds lr {train.lr}", "lower train.min_lr")
        )
    return problems


@rule("train", "lora")
def host_embedding_is_frozen(train, lora) -> list[tuple[str, str, str]]:
    if train.offload_embedding and not lora.enabled:
        return [
            (
                "train.offload_embedding",
                "full fine-tuning trains the embedding, which must then stay on the GPU",
                "drop it, or train with lora.enabled: true",
            )
        ]
    return []


@rule("train")
def kept_blocks_need_checkpointing(train) -> list[tuple[str, str, str]]:
    if train.keep_activations and train.activation_checkpointing == "none":
        return [
            (
                "train.keep_activations",
                "without activation checkpointing every block keeps its activations already",
                "set train.activation_checkpointing (full or selective), or drop keep_activations",
            )
        ]
    return []


@rule("train", "parallel", "model")
def captured_step_runs_on_one_gpu(train, parallel, model) -> list[tuple[str, str, str]]:
    if not train.cuda_graph:
        return []
    problems = []
    offloaded = [
        name
        for name in ("offload_checkpoints", "offload_activations", "offload_embedding")
        if getattr(train, name)
    ]
    if offloaded:
        problems.append(
            (
                "train.cuda_graph",
                f"a captured step cannot copy to and from host memory ({', '.join(offloaded)})",
                f"drop train.cuda_graph or {', '.join('train.' + n for n in offloaded)}",
            )
        )
    if parallel.strategy in ("ddp", "fsdp"):
        problems.append(
            (
                "train.cuda_graph",
                f"steps of parallel.strategy {parallel.strategy} are not captured",
                "drop train.cuda_graph, or run on one GPU (parallel.strategy: single)",
            )
        )
    if model.attention in ("sdpa", "eager"):
        problems.append(
            (
                "train.cuda_graph",
                f"attention {model.attention} reads the document lengths on the host each step",
                "set model.attention: auto, flash4 or varlen",
            )
        )
    return problems


@rule("train", "data")
def micro_batch_fits_a_sequence(train, data) -> list[tuple[str, str, str]]:
    if train.tokens_per_micro_batch < data.max_seq_len:
        return [
            (
                "train.tokens_per_micro_batch",
                f"{train.tokens_per_micro_batch} tokens cannot hold one sequence of data.max_seq_len={data.max_seq_len}",
                "raise train.tokens_per_micro_batch or lower data.max_seq_len",
            )
        ]
    return []


@rule("data")
def source_formats(data) -> list[tuple[str, str, str]]:
    problems = []
    for group in ("train", "eval"):
        for index, source in enumerate(getattr(data, group)):
            where = f"data.{group}.{index}"
            if source.metadata is not None and source.format != "mlperf":
                problems.append(
                    (
                        f"{where}.metadata",
                        f"packing metadata only applies to format mlperf, not {source.format}",
                        "remove metadata, or set format: mlperf for a packed .npy",
                    )
                )
            if source.format == "mlperf" and source.field_map:
                problems.append(
                    (
                        f"{where}.field_map",
                        "format mlperf has fixed fields (input_ids, loss_mask, seq_start_id)",
                        "remove field_map",
                    )
                )
    return problems


@rule("train", "eval")
def evaluation_steps_once(train, eval) -> list[tuple[str, str, str]]:
    if train.eval_steps is None or eval.every_steps in (None, train.eval_steps):
        return []
    return [
        (
            "train.eval_steps",
            f"contradicts eval.every_steps={eval.every_steps}",
            "set only eval.every_steps (train.eval_steps is its older name)",
        )
    ]


@rule("train", "data", "eval")
def evaluation_needs_data(train, data, eval) -> list[tuple[str, str, str]]:
    if data.eval and data.eval_fraction is not None:
        return [
            (
                "data.eval_fraction",
                "set both with data.eval",
                "keep data.eval or data.eval_fraction, not both",
            )
        ]
    if data.eval or data.eval_fraction is not None:
        return []
    problems = []
    if eval.every_steps is not None or train.eval_steps is not None:
        problems.append(
            (
                "eval.every_steps" if eval.every_steps is not None else "train.eval_steps",
                "evaluation asked for but data.eval is empty",
                "add data.eval sources or set data.eval_fraction",
            )
        )
    if eval.num_samples > 0:
        problems.append(
            (
                "eval.num_samples",
                "accuracy asked for but data.eval is empty",
                "add data.eval sources or set data.eval_fraction",
            )
        )
    return problems


@rule("parallel")
def zero_names_agree(parallel) -> list[tuple[str, str, str]]:
    if parallel.zero_stage is None or parallel.reshard_after_forward is None:
        return []
    if (parallel.zero_stage == 3) == parallel.reshard_after_forward:
        return []
    return [
        (
            "parallel.reshard_after_forward",
            f"contradicts parallel.zero_stage={parallel.zero_stage}",
            "set only one: zero_stage 2 = reshard_after_forward false, 3 = true",
        )
    ]


@rule("parallel")
def mesh_needs_sharding(parallel) -> list[tuple[str, str, str]]:
    """Tensor, expert and replica dimensions compose with FSDP2 on a device mesh, not with DDP."""
    sizes = {
        name: getattr(parallel, name)
        for name in ("tensor_parallel", "expert_parallel", "data_parallel_replicate")
        if getattr(parallel, name) > 1
    }
    if not sizes or parallel.strategy in ("auto", "fsdp"):
        return []
    named = ", ".join(f"parallel.{name}={size}" for name, size in sizes.items())
    return [
        (
            "parallel.strategy",
            f"{parallel.strategy} cannot run {named}: those dimensions live on FSDP2's device mesh",
            "set parallel.strategy to fsdp (or auto)",
        )
    ]
