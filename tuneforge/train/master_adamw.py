"""AdamW that keeps an accurate value of every 16-bit weight it trains: an fp32 master copy
(`master`) or a bf16 remainder beside the weight (`compensated`, Kahan summation), and fp32
states either way. The model keeps computing in its own dtype; after each update the weight is
the accurate value rounded to it. fp32 parameters (LoRA adapters) are updated directly.

The update itself is torch's fused AdamW kernel over fp32 working values, taken in chunks so
that the step's fp32 scratch (gradients, and the compensated weights) stays bounded. It skips a
non-finite update on the device as torch's fused AdamW does (`found_inf`).

In a checkpoint the accurate values stand in for the weights (`accurate_weights`), so that a
run resumes exactly and its checkpoints read alike under every strategy (FSDP2's master weights
are its fp32 shards)."""

from collections.abc import Iterable, Iterator
from typing import Any, Literal

import torch
from torch.optim.adamw import adamw

from tuneforge.precision.trained_weights import LOW_PRECISION

Update = Literal["master", "compensated"]
CHUNK_ELEMENTS = 1 << 26
"""Elements per fused kernel call: bounds the fp32 scratch to ~0.25 GiB per tensor list."""
FP32_STATE = ("master", "exp_avg", "exp_avg_sq")
"""State kept in fp32 whatever the weight's dtype (torch's loading would cast it to it)."""


class MasterAdamW(torch.optim.Optimizer):
    def __init__(
        self,
        params: Iterable[Any],
        *,
        lr: float,
        betas: tuple[float, float],
        eps: float,
        weight_decay: float,
        update: Update = "master",
    ) -> None:
        # `fused` marks the groups for the captured step and for torch's loading of `step`
        defaults = dict(
            lr=lr, betas=betas, eps=eps, weight_decay=weight_decay, fused=True, capturable=False
        )
        super().__init__(params, defaults)
        self.update = update

    def _state(self, param: torch.Tensor) -> dict[str, torch.Tensor]:
        state = self.state[param]
        if not state:
            state["step"] = torch.zeros((), dtype=torch.float32, device=param.device)
            state["exp_avg"] = torch.zeros_like(param, dtype=torch.float32)
            state["exp_avg_sq"] = torch.zeros_like(param, dtype=torch.float32)
            if param.dtype in LOW_PRECISION and self.update == "master":
                state["master"] = param.detach().float()
            elif param.dtype in LOW_PRECISION:
                state["compensation"] = torch.zeros_like(param)
        return state

    @torch.no_grad()
    def step(self, closure=None):
        assert closure is None, "no closure: the step's loss comes from the recipe"
        found_inf = getattr(self, "found_inf", None)
        for group in self.param_groups:
            trained = [(p, self._state(p)) for p in group["params"] if p.grad is not None]
            beta1, beta2 = group["betas"]
            for chunk in _chunks(trained):
                work = [_working_value(p, state) for p, state in chunk]
                grads = [p.grad.float() for p, _ in chunk]  # the fp32 gradients' scratch
                adamw(
                    work,
                    grads,
                    [state["exp_avg"] for _, state in chunk],
                    [state["exp_avg_sq"] for _, state in chunk],
                    [],
                    [state["step"] for _, state in chunk],
                    fused=True,
                    found_inf=found_inf,
                    amsgrad=False,
                    beta1=beta1,
                    beta2=beta2,
                    lr=group["lr"],
                    weight_decay=group["weight_decay"],
                    eps=group["eps"],
                    maximize=False,
                )
                for (param, state), value in zip(chunk, work, strict=True):
                    _write_back(param, state, value)
        return None

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        """torch's loading casts every floating state to its parameter's dtype: the fp32 master
        and moments are put back as they were saved."""
        super().load_state_dict(state_dict)
        saved_ids = [i for group in state_dict["param_groups"] for i in group["params"]]
        params = [p for group in self.param_groups for p in group["params"]]
        for saved_id, param in zip(saved_ids, params, strict=True):
            saved = state_dict["state"].get(saved_id, {})
            for key in FP32_STATE:
                if key in saved:
                    self.state[param][key] = saved[key].to(param.device, torch.float32, copy=True)


def _chunks(
    trained: list[tuple[torch.Tensor, dict[str, torch.Tensor]]],
) -> Iterator[list[tuple[torch.Tensor, dict[str, torch.Tensor]]]]:
    chunk: list[tuple[torch.Tensor, dict[str, torch.Tensor]]] = []
    size = 0
    for entry in trained:
        if chunk and size + entry[0].numel() > CHUNK_ELEMENTS:
            yield chunk
            chunk, size = [], 0
        chunk.append(entry)
        size += entry[0].numel()
    if chunk:
        yield chunk


def _working_value(param: torch.Tensor, state: dict[str, torch.Tensor]) -> torch.Tensor:
    """The fp32 value the update applies to: the master itself, the weight plus its remainder,
    or an fp32 parameter itself."""
    if "master" in state:
        return state["master"]
    if "compensation" in state:
        return param.float().add_(state["compensation"])
    return param


def _write_back(param: torch.Tensor, state: dict[str, torch.Tensor], value: torch.Tensor) -> None:
    if value is param:
        return
    param.copy_(value)
    if "compensation" in state:  # what rounding to the weight's dtype left out
        state["compensation"].copy_(value.sub_(param))


AccurateParts = dict[str, tuple[str, torch.Tensor]]
"""Per parameter name, the optimizer's `master` or `compensation` entry taken out of its state."""


def accurate_weights(model_state: dict[str, Any], optimizer_state: dict[str, Any]) -> AccurateParts:
    """In place, for a checkpoint (both dicts keyed by parameter name, as `get_state_dict` gives
    them): each 16-bit weight the optimizer keeps an accurate value of is replaced by that value
    in fp32 (its master itself, or weight + remainder), and the master or remainder leaves the
    optimizer's state; returns what left, for `split_accurate_weights`."""
    parts: AccurateParts = {}
    states = optimizer_state.get("state", {})
    for name, state in list(states.items()):
        for key in ("master", "compensation"):
            if key not in state:
                continue
            part = state[key]
            parts[name] = (key, part)
            # a new dict: the one given may be the optimizer's own state
            states[name] = {k: v for k, v in state.items() if k != key}
            weight = model_state[name]
            model_state[name] = part if key == "master" else weight.float() + part.float()
    return parts


def split_accurate_weights(
    model_state: dict[str, Any], optimizer_state: dict[str, Any], parts: AccurateParts
) -> None:
    """After a checkpoint was read into `accurate_weights`' layout: the fp32 value becomes the
    master (or the remainder beside the rounded weight) again. The weight's entry keeps the
    fp32 value, which loading rounds into the model's dtype."""
    for name, (key, part) in parts.items():
        value = model_state[name]
        if key == "master":
            optimizer_state["state"][name][key] = value
        else:
            optimizer_state["state"][name][key] = (value - value.to(part.dtype).float()).to(
                part.dtype
            )
