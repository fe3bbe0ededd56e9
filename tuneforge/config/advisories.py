"""Settings that are valid but will not do what they seem to: said by `config validate` and at
the start of training, without stopping either."""

from tuneforge.config.schema import RunConfig


def advisories(config: RunConfig) -> list[str]:
    found = []
    save_steps, max_steps = config.checkpoint.save_steps, config.train.max_steps
    if save_steps is not None and max_steps is not None and save_steps >= max_steps:
        found.append(
            f"checkpoint.save_steps={save_steps} is not below train.max_steps={max_steps}: no "
            "periodic checkpoint will be written, only the final weights (and a checkpoint "
            "before a time limit or on a signal); lower checkpoint.save_steps to resume from "
            "within the run"
        )
    if config.precision.fp4_param_gather and config.parallel.strategy in ("single", "ddp"):
        found.append(
            f"precision.fp4_param_gather has no effect with parallel.strategy="
            f"{config.parallel.strategy}: it shards the FP4 base and all-gathers it as FP4 "
            "under FSDP2 (parallel.strategy fsdp, or auto on several GPUs)"
        )
    return found
