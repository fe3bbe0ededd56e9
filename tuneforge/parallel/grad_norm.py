"""The gradient norm over every trained parameter and clipping to it, where the parameters are
DTensors on several meshes (FSDP2 over the data-parallel ranks, with tensor- or
expert-parallel dimensions on some of them): one norm per mesh, each counting every element
once, then combined."""

from collections import defaultdict
from collections.abc import Sequence

import torch
from torch.distributed.tensor import DTensor


def clip_grad_norm(params: Sequence[torch.Tensor], max_norm: float) -> torch.Tensor:
    """The total L2 norm of the parameters' gradients (a plain 0-d tensor, the same on every
    rank), after scaling them down to `max_norm` where it is above."""
    groups: dict[object, list[torch.Tensor]] = defaultdict(list)
    for param in params:
        if param.grad is not None:
            mesh = param.grad.device_mesh if isinstance(param.grad, DTensor) else None
            groups[mesh].append(param.grad)
    norms = []
    for grads in groups.values():
        norm = torch.nn.utils.get_total_norm(grads, 2.0)
        norms.append(norm.full_tensor() if isinstance(norm, DTensor) else norm)
    if not norms:
        return torch.zeros(())
    total = norms[0] if len(norms) == 1 else torch.stack([n.float() for n in norms]).norm()
    coefficient = torch.clamp(max_norm / (total + 1e-6), max=1.0)
    with torch.no_grad():
        for grads in groups.values():
            local = [g.to_local() if isinstance(g, DTensor) else g for g in grads]
            torch._foreach_mul_(local, coefficient.to(local[0].device, local[0].dtype))
    return total
