"""How much longer a data-parallel step takes than its ranks' mean work: every rank waits for the
slowest at the gradient reduction, and packed micro-batches of the same tokens differ in
attention work. The epoch is dealt exactly as the loader deals it (`packing.epoch_deal`), plain
or balanced (`data.balance_ranks`), and each step's largest rank work is compared with the mean."""

from collections.abc import Sequence

from tuneforge.config import RunConfig
from tuneforge.data.packing import epoch_deal
from tuneforge.plan.workload import Workload


def rank_waits(epoch: Workload, config: RunConfig, data_parallel: int) -> tuple[float, float]:
    """The step's time over its mean rank's work for the epoch's micro-batches dealt as
    configured, and dealt with `data.balance_ranks`."""
    configured, balanced = (
        slowest_rank_factor(
            epoch.micro_batch_flops,
            epoch.micro_batch_attention,
            data_parallel,
            config.train.grad_accum_steps,
            config.train.seed,
            balance,
        )
        for balance in (config.data.balance_ranks, True)
    )
    return configured, balanced


def slowest_rank_factor(
    flops: Sequence[float],
    attention: Sequence[int],
    world_size: int,
    grad_accum_steps: int,
    seed: int,
    balance: bool,
) -> float:
    """Σ over the epoch's steps of the slowest rank's FLOPs over Σ of the mean rank's (1.0: no
    wait). `flops` and `attention`: each micro-batch's, in packing order."""
    dealt = epoch_deal(len(flops), seed, 0, world_size, attention if balance else ())
    ranks = [dealt[rank::world_size] for rank in range(world_size)]
    steps = len(ranks[0]) // grad_accum_steps
    if world_size == 1 or steps == 0:
        return 1.0
    slowest = mean = 0.0
    for step in range(steps):
        window = slice(step * grad_accum_steps, (step + 1) * grad_accum_steps)
        work = [sum(flops[i] for i in rank[window]) for rank in ranks]
        slowest += max(work)
        mean += sum(work) / world_size
    return slowest / mean
