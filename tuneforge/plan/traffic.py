"""Bytes each GPU sends per optimizer step in its data-parallel collectives. A ring collective
over n ranks sends (n - 1) / n of its buffer from each rank per phase: DDP's all-reduce is two
phases over the trainable gradients; FSDP2 gathers every weight, frozen ones included (once a
step under ZeRO-2, which keeps them between micro-batches; for forward and again for backward
of every micro-batch under ZeRO-3), and reduce-scatters the gradients."""

from tuneforge.models.cost import lora_params
from tuneforge.plan.memory import Setup


def step_traffic_bytes(setup: Setup, reduce_bytes: int) -> float:
    """`reduce_bytes`: bytes per element of FSDP2's gradient reduction (4 for fp32)."""
    n = setup.data_parallel
    if n == 1:
        return 0.0
    share = (n - 1) / n
    args = setup.args
    if setup.lora is not None:
        trainable, grad_bytes = lora_params(args, setup.lora), 4  # fp32 adapters
    else:
        trainable, grad_bytes = args.num_params(), setup.param_bytes
    if setup.zero_stage == 0:
        return 2 * share * trainable * grad_bytes
    gathers = 1 if setup.zero_stage <= 2 else 2 * setup.grad_accum_steps
    weights = args.num_params() * setup.param_bytes
    return share * (gathers * weights + trainable * reduce_bytes)
