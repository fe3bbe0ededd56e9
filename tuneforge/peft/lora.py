"""LoRA as a module swap: a `LoRALinear` wraps a frozen base linear and adds
scale · B·A·x, with scale = alpha / r (or alpha / √r with rsLoRA) and dropout before A (`pre`,
as PEFT) or on the update (`post`, as Megatron allows)."""

import abc
import math

import torch
from torch import nn

from tuneforge.peft.decomposed_init import METHODS as DECOMPOSED
from tuneforge.peft.decomposed_init import decompose_into
from tuneforge.peft.dora import dora_forward, dora_merged_weight, initial_magnitude
from tuneforge.peft.fused_lora import FusedLoRALinear, as_rows, shaped_like
from tuneforge.peft.shared_input_lora import SharedInputLoRA, StackedSharedInputLoRA


def lora_scaling(rank: int, alpha: float, use_rslora: bool) -> float:
    return alpha / math.sqrt(rank) if use_rslora else alpha / rank


@torch.no_grad()
def init_lora_A(
    weight: torch.Tensor, method: str, rank: int, generator: torch.Generator | None = None
) -> None:
    """Initialise A [..., r, in] in place; each trailing [r, in] slice is one adapter's A.
    kaiming (or default): uniform ±1/√in (PEFT's Kaiming-uniform with a=√5); xavier: normal with
    std √(2/(in+r)) (Megatron's xavier-normal); gaussian: normal with std 1/r (PEFT's)."""
    fan_in = weight.shape[-1]
    if method in ("kaiming", "default"):
        bound = 1.0 / math.sqrt(fan_in)
        weight.uniform_(-bound, bound, generator=generator)
    elif method == "xavier":
        weight.normal_(0.0, math.sqrt(2.0 / (fan_in + rank)), generator=generator)
    elif method == "gaussian":
        weight.normal_(0.0, 1.0 / rank, generator=generator)
    else:
        raise ValueError(f"unknown LoRA init {method!r}: use default, kaiming, xavier or gaussian")


def adapter_compute_dtype(mode: str, x: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """`model`: the activations' dtype (the adapter weights are cast, the activations not);
    `float32`: the adapter weights' own dtype (activations cast up, as PEFT does)."""
    if mode == "model":
        return x.dtype
    if mode == "float32":
        return weight.dtype
    raise ValueError(f"compute_dtype must be model or float32, not {mode!r}")


class AdapterDropout(nn.Module):
    """Dropout on the adapter's input (`pre`) or on its update (`post`)."""

    def __init__(self, p: float, position: str) -> None:
        super().__init__()
        if position not in ("pre", "post"):
            raise ValueError(f"dropout_position must be pre or post, not {position!r}")
        self.p = p
        self.position = position
        self.dropout = nn.Dropout(p) if p > 0 else nn.Identity()

    def pre(self, x: torch.Tensor) -> torch.Tensor:
        return self.dropout(x) if self.position == "pre" else x

    def post(self, update: torch.Tensor) -> torch.Tensor:
        return self.dropout(update) if self.position == "post" else update


LOW_PRECISION_MERGE = (
    "this adapter's base computes in a low-precision format: merge into the base weights as "
    "saved (tuneforge export merge), not into the running model"
)


class LowPrecisionBase(nn.Module, abc.ABC):
    """A frozen base linear that computes in a low-precision format (`tuneforge.precision`): it
    makes its product itself, with a LoRA update accumulated into it where one is given."""

    in_features: int
    out_features: int
    bias: nn.Parameter | None

    @abc.abstractmethod
    def product(
        self,
        rows: torch.Tensor,
        lora_A: torch.Tensor | None = None,
        lora_B: torch.Tensor | None = None,
        scaling: float = 0.0,
    ) -> torch.Tensor:
        """rows·Wᵀ (+ bias) (+ scaling·(rows·Aᵀ)·Bᵀ) for `rows` [N, in], differentiable in
        `rows`, A and B."""

    @abc.abstractmethod
    def weight_bytes(self) -> int:
        """Bytes of the weight as it is held for the products (values and scales)."""

    def product_together(
        self, rows: torch.Tensor, adapters: list["LoRALinear"]
    ) -> list[torch.Tensor] | None:
        """The outputs of `adapters` reading `rows`, this base the first's, from one product where
        their weights are stacked with this one's; None where they are not."""
        return None

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return shaped_like(x, self.product(as_rows(x)))


class LoRALinear(nn.Module):
    def __init__(
        self,
        base: nn.Linear,
        rank: int,
        alpha: float,
        dropout: float = 0.0,
        dtype: torch.dtype | None = None,
        *,
        dropout_position: str = "pre",
        use_rslora: bool = False,
        init: str = "kaiming",
        compute_dtype: str = "model",
        use_dora: bool = False,
    ) -> None:
        super().__init__()
        self.base: nn.Linear | LowPrecisionBase = base
        self.compute_dtype = compute_dtype
        self.fused = True
        """Run `FusedLoRALinear` where it applies (False: the plain reference expression)."""
        self.enabled = True
        """False: the base alone (a preference objective's reference, `adapters_disabled`)."""
        self.rank = rank
        self.alpha = alpha
        self.use_rslora = use_rslora
        self.init = init
        self.scaling = lora_scaling(rank, alpha, use_rslora)
        device, dtype = base.weight.device, dtype or base.weight.dtype
        self.lora_A = nn.Parameter(torch.empty(rank, base.in_features, device=device, dtype=dtype))
        self.lora_B = nn.Parameter(torch.zeros(base.out_features, rank, device=device, dtype=dtype))
        self.dropout = AdapterDropout(dropout, dropout_position)
        self.lora_magnitude = (
            nn.Parameter(torch.empty(base.out_features, device=device, dtype=dtype))
            if use_dora
            else None
        )
        """DoRA's magnitude of each output row (`peft/dora.py`); None for plain LoRA."""
        self.initial: tuple[torch.Tensor, torch.Tensor] | None = None
        """A₀ and B₀ of an adapter initialised from the base (`peft/decomposed_init.py`), whose
        s·B₀·A₀ the base no longer holds."""
        self.stacked_weight: torch.Tensor | None = None
        self.stacked_bias: torch.Tensor | None = None
        """Set on the first of linears whose frozen weights are views of one stacked tensor
        (`peft/stacked_weights.py`)."""
        self.reset_lora_parameters()

    def _apply(self, fn, recurse=True):
        # moved or cast, the weights are no longer views of the stacked tensor
        self.stacked_weight = self.stacked_bias = None
        return super()._apply(fn, recurse)

    def reset_lora_parameters(self, generator: torch.Generator | None = None) -> None:
        """A by `init`, B zero (and DoRA's magnitude the base rows' norms): the adapter starts
        as a no-op. `pissa` and `olora` take A and B from the base weight instead, and leave the
        residual in the base (`peft/decomposed_init.py`): done once, when the adapter is put on."""
        if self.init in DECOMPOSED:
            if self.initial is None:
                decompose_into(self, self.init)
            return
        init_lora_A(self.lora_A, self.init, self.rank, generator)
        with torch.no_grad():
            self.lora_B.zero_()
            if self.lora_magnitude is not None:
                self.lora_magnitude.copy_(initial_magnitude(self))

    def runs_fused(self, x: torch.Tensor) -> bool:
        """Whether `FusedLoRALinear` (or a low-precision base's own product) computes this
        adapter on `x`: frozen base (and bias), no dropout, the adapter computing in the
        activations' dtype."""
        return (
            self.fused
            and self.enabled
            and self.lora_magnitude is None
            and adapter_compute_dtype(self.compute_dtype, x, self.lora_A) == x.dtype
            and self.dropout.p == 0
            and not any(param.requires_grad for param in self.base.parameters())
        )

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        base = self.base
        if not self.enabled:
            return base(x)
        if isinstance(base, LowPrecisionBase) and self.runs_fused(x):
            y = base.product(as_rows(x), self.lora_A, self.lora_B, self.scaling)
            return shaped_like(x, y)
        if self.runs_fused(x):
            assert isinstance(base, nn.Linear)
            y = FusedLoRALinear.apply(
                as_rows(x), base.weight, base.bias, self.lora_A, self.lora_B, self.scaling
            )
            return shaped_like(x, y)
        dtype = adapter_compute_dtype(self.compute_dtype, x, self.lora_A)
        if self.lora_magnitude is not None:
            return dora_forward(self, x, dtype)
        h = self.dropout.pre(x).to(dtype)
        update = (h @ self.lora_A.to(dtype).t()) @ self.lora_B.to(dtype).t()
        return base(x) + self.dropout.post(update * self.scaling).to(x.dtype)

    @staticmethod
    def project_together(x: torch.Tensor, linears: list[nn.Module]) -> list[torch.Tensor]:
        """Each of `linears` applied to `x`; where all are adapters running fused, as one
        `SharedInputLoRA` (their adapters read `x` once), or `StackedSharedInputLoRA` where
        their frozen weights are stacked (the first linear holds the stacked tensor)."""
        adapters = [linear for linear in linears if isinstance(linear, LoRALinear)]
        if (
            len(linears) < 2
            or len(adapters) < len(linears)
            or not all(adapter.runs_fused(x) for adapter in adapters)
        ):
            return [linear(x) for linear in linears]
        rows = as_rows(x)
        first = adapters[0].base
        if isinstance(first, LowPrecisionBase):
            together = first.product_together(rows, adapters)
            if together is None:
                return [linear(x) for linear in linears]
            return [shaped_like(x, y) for y in together]
        if not all(isinstance(adapter.base, nn.Linear) for adapter in adapters):
            return [linear(x) for linear in linears]
        stacked = adapters[0].stacked_weight
        if stacked is not None:
            y = StackedSharedInputLoRA.apply(
                rows,
                tuple(adapter.scaling for adapter in adapters),
                stacked,
                adapters[0].stacked_bias,
                *(adapter.lora_A for adapter in adapters),
                *(adapter.lora_B for adapter in adapters),
            )
            outputs = y.split([adapter.base.out_features for adapter in adapters], dim=1)
            return [shaped_like(x, y) for y in outputs]
        outputs = SharedInputLoRA.apply(
            rows,
            tuple(adapter.scaling for adapter in adapters),
            *(adapter.base.weight for adapter in adapters),
            *(adapter.base.bias for adapter in adapters),
            *(adapter.lora_A for adapter in adapters),
            *(adapter.lora_B for adapter in adapters),
        )
        return [shaped_like(x, y) for y in outputs]

    @torch.no_grad()
    def delta_weight(self) -> torch.Tensor:
        return (self.lora_B.float() @ self.lora_A.float()) * self.scaling

    @torch.no_grad()
    def merged_weight(self) -> torch.Tensor:
        if not isinstance(self.base, nn.Linear):
            raise TypeError(LOW_PRECISION_MERGE)
        if self.lora_magnitude is not None:
            return dora_merged_weight(self).to(self.base.weight.dtype)
        return (self.base.weight.float() + self.delta_weight()).to(self.base.weight.dtype)
