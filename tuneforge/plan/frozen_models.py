"""What an objective's frozen models (`config/objectives/`: a preference run's reference, a
teacher) cost a run: their weights beside the trained model and their forward FLOPs per token.
The planner, the trainer's MFU and the benchmark count them alike."""

from tuneforge.config.objectives.declaration import FrozenModel
from tuneforge.config.objectives.registry import declaration_of
from tuneforge.config.schema import RunConfig
from tuneforge.config.sections.model import ModelSection
from tuneforge.hardware.gpus import GIB
from tuneforge.models.api import model_args
from tuneforge.models.args import ModelArgs
from tuneforge.models.cost import forward_flops_per_token
from tuneforge.plan.base_weights import BaseWeights, frozen_linears
from tuneforge.plan.memory import frozen_weight_bytes


def section_model_args(section: ModelSection) -> ModelArgs:
    source = section.path if section.path is not None else section.name
    assert source is not None  # guaranteed by the config rules
    return model_args(source, section.num_layers)


def frozen_models(config: RunConfig) -> tuple[FrozenModel, ...]:
    return declaration_of(config).frozen_models(config)


def forward_every_step(config: RunConfig, args: ModelArgs) -> list[ModelArgs]:
    """The shapes of the frozen models that run a forward of every token each step (`args`: the
    trained model's, which a frozen copy or an adapters-off reference shares)."""
    return [
        args if frozen.model is None else section_model_args(frozen.model)
        for frozen in frozen_models(config)
        if frozen.forward_every_step
    ]


def frozen_forward_flops_per_token(config: RunConfig, args: ModelArgs, length: int) -> float:
    """FLOPs per trained token of those forwards, on documents of `length`."""
    return sum(forward_flops_per_token(shape, length) for shape in forward_every_step(config, args))


def holds_frozen_copy(config: RunConfig) -> bool:
    """A second copy of the trained model's weights, frozen (a preference run's reference)."""
    return any(f.holds_weights and f.model is None for f in frozen_models(config))


def own_weight_bytes(frozen: FrozenModel, ranks: int = 1) -> float:
    """Bytes per GPU of a frozen model with its own weights (a teacher held beside the student),
    its blocks sharded across `ranks` under FSDP2; 0 for the others."""
    section = frozen.model
    if section is None or not frozen.holds_weights:
        return 0.0
    args = section_model_args(section)
    param_bytes = 4 if section.dtype == "float32" else 2
    weights = frozen_weight_bytes(args, param_bytes, ranks)
    if section.quantize:  # its linears in 4 bits, held whole on every rank (buffers, not sharded)
        four_bit = BaseWeights(f"bnb-{section.quantize}", double_quant=section.double_quant)
        weights += sum(four_bit.bytes(args, param_bytes))
        weights -= frozen_linears(args)[0] * param_bytes / ranks
    return weights


def describe_frozen_models(config: RunConfig, args: ModelArgs, param_bytes: int) -> str | None:
    """What the objective's frozen models add to the run, for `tuneforge plan`."""
    declaration = declaration_of(config)
    lines = []
    for frozen in frozen_models(config):
        who = f"the {frozen.role} ({frozen.kind})"
        if not frozen.forward_every_step:
            text = f"{who} runs one forward of every token before training, alone"
        else:
            text = f"{who} runs a forward of every token each step"
        if frozen.holds_weights and frozen.model is None:
            text += f", its frozen copy {args.num_params() * param_bytes / GIB:.2f} GiB"
        elif frozen.holds_weights:
            text += f", its weights {own_weight_bytes(frozen) / GIB:.2f} GiB"
        lines.append(text + (f"; {frozen.note}" if frozen.note else ""))
    if not lines:
        return None
    return f"{declaration.short_name(declaration.settings_of(config))}: " + "; ".join(lines)
