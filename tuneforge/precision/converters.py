"""The swaps a precision makes on a model, each a converter that returns what it did (counts and
bytes), never words: `report.py` says it, `refusals.py` refuses what cannot run, and
`apply.py` picks the converters a precision section asks for and runs them in order.

- `FrozenLowPrecision`: frozen projections (a LoRA base, or linears nothing trains) to FP8 or
  emulated FP4 ones.
- `Fp8ExpertBanks`: frozen expert banks to FP8 through the grouped kernel.
- `Fp8Trained`: trained projections (full fine-tuning) to FP8 ones, ours or torchao's.
- `FourBitBase`: frozen projections to bitsandbytes' 4-bit ones (QLoRA), or the ones a model
  directory was quantised into on its way to the GPU (`ArrivedFourBit`)."""

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from functools import partial

from torch import nn

from tuneforge.config.sections.precision import PrecisionSection
from tuneforge.errors import TuneforgeError
from tuneforge.models.cost import PROJECTION_NAMES
from tuneforge.models.decoder import Decoder
from tuneforge.models.moe import ExpertBank
from tuneforge.peft.lora import LoRALinear, LowPrecisionBase
from tuneforge.peft.targets import BANK_PROJECTIONS
from tuneforge.precision.bnb4bit import Bnb4bitLinear
from tuneforge.precision.fp4 import BLOCK_SIZE
from tuneforge.precision.fp8 import Fp8Recipe, fits_scaled_mm
from tuneforge.precision.fp8_experts import Fp8ExpertWeights, grouped_fp8_here
from tuneforge.precision.fp8_training import Fp8TrainingLinear
from tuneforge.precision.frozen_linear import Fp4Linear, Fp8Linear
from tuneforge.precision.torchao_training import require_torchao, torchao_config, torchao_linear

ArrivedFourBit = dict[nn.Linear, Bnb4bitLinear]
"""Projections of a model directory quantised on their way to the GPU (`bnb4bit.
quantize_on_arrival`), by the placeholder linear that stands for each until the swap."""


@dataclass
class Swapped:
    """What a converter of linears did: the kinds swapped and left (by projection name), the
    weights' bytes before and after, and the weights swapped."""

    kinds: Counter[str] = field(default_factory=Counter)
    left: Counter[str] = field(default_factory=Counter)
    bytes_before: int = 0
    bytes_after: int = 0
    weights: int = 0


def frozen_linears(model: Decoder) -> Iterator[tuple[nn.Module, str, str, nn.Linear]]:
    """(parent, attribute, kind, linear) of every frozen projection in the decoder blocks: the
    base of an adapter, or a linear nothing trains."""
    for module in model.layers.modules():
        for leaf, child in module.named_children():
            if leaf not in PROJECTION_NAMES:
                continue
            if isinstance(child, LoRALinear) and isinstance(child.base, nn.Linear):
                yield child, "base", leaf, child.base
            elif type(child) is nn.Linear and not any(p.requires_grad for p in child.parameters()):
                yield module, leaf, leaf, child


@dataclass(frozen=True)
class FrozenLowPrecision:
    section: PrecisionSection
    recipe: Fp8Recipe | None
    gathered: bool = False
    """FP4 codes sharded under FSDP2 and all-gathered as FP4 (`fp4_param_gather`)."""

    def fits(self, linear: nn.Linear) -> bool:
        if self.recipe is not None:
            return fits_scaled_mm(linear.in_features, linear.out_features)
        block = BLOCK_SIZE[self.section.fp4_recipe]
        return linear.in_features % block == 0 and linear.out_features % block == 0

    def low_precision(self, linear: nn.Linear) -> LowPrecisionBase:
        section = self.section
        if self.recipe is not None:
            return Fp8Linear(linear, self.recipe, keep_weight=not section.fp8_base_weights)
        return Fp4Linear(
            linear, section.fp4_recipe, packed=section.fp4_param, keep_weight=False,
            sharded=self.gathered,
        )  # fmt: skip

    def convert(self, model: Decoder) -> Swapped:
        done = Swapped()
        # taken off the list one at a time, so that each 16-bit weight is freed once swapped:
        # the conversion holds the model plus one weight, not both copies of the model
        pending = list(frozen_linears(model))[::-1]
        while pending:
            parent, attribute, leaf, linear = pending.pop()
            if not self.fits(linear):
                done.left[leaf] += 1
                continue
            low = self.low_precision(linear)
            setattr(parent, attribute, low)
            done.kinds[leaf] += 1
            done.weights += linear.weight.numel()
            done.bytes_before += linear.weight.numel() * linear.weight.element_size()
            done.bytes_after += low.weight_bytes()
        return done


@dataclass
class BanksSwapped:
    banks: int = 0
    projections: int = 0
    trained: int = 0
    weight_bytes: int = 0
    stay_because: str | None = None
    """Why every bank stays in the model's dtype: `fp4` (no emulated FP4 expert product) or
    `no grouped kernel` (on this GPU)."""


@dataclass(frozen=True)
class Fp8ExpertBanks:
    recipe: Fp8Recipe | None
    rowwise: bool
    drop_bf16: bool

    def convert(self, model: Decoder) -> BanksSwapped:
        banks = [module for module in model.modules() if isinstance(module, ExpertBank)]
        done = BanksSwapped(banks=len(banks))
        if not banks:
            return done
        if self.recipe is None:
            done.stay_because = "fp4"
            return done
        device = banks[0].gate_up_proj.device
        if device.type == "cuda" and not grouped_fp8_here(device):
            done.stay_because = "no grouped kernel"
            return done
        for bank in banks:
            for projection in BANK_PROJECTIONS:
                weight = getattr(bank, projection)
                if weight.requires_grad or not fits_scaled_mm(weight.shape[2], weight.shape[1]):
                    done.trained += 1
                    continue
                low = Fp8ExpertWeights(weight, self.rowwise, self.recipe.forward)
                bank.low_precision[projection] = low
                if self.drop_bf16:
                    setattr(bank, projection, None)  # the FP8 copy is the only one
                done.projections += 1
                done.weight_bytes += low.weight_bytes()
        return done


@dataclass
class TrainedSwapped(Swapped):
    fp8_gather: bool = False
    """Under FSDP2 the weights are all-gathered in FP8 (torchao's tensorwise recipe)."""


@dataclass(frozen=True)
class Fp8Trained:
    recipe: Fp8Recipe
    implementation: str
    """`tuneforge` (our `torch._scaled_mm` products) or `torchao` (its float8 training)."""
    sharded: bool

    def convert(self, model: Decoder) -> TrainedSwapped:
        done = TrainedSwapped()
        trained = []
        for module in model.layers.modules():
            for leaf, child in list(module.named_children()):
                if leaf not in PROJECTION_NAMES or type(child) is not nn.Linear:
                    continue
                if not any(param.requires_grad for param in child.parameters()):
                    continue
                if not fits_scaled_mm(child.in_features, child.out_features):
                    done.left[leaf] += 1
                    continue
                trained.append((module, leaf, child))
        if not trained:
            return done
        swap: Callable[[nn.Linear], nn.Linear]
        if self.implementation == "torchao":
            require_torchao()
            config = torchao_config(self.recipe, self.sharded)
            done.fp8_gather = bool(config.enable_fsdp_float8_all_gather)
            swap = partial(torchao_linear, config=config)
        else:
            swap = partial(Fp8TrainingLinear, recipe=self.recipe)
        for module, leaf, child in trained:
            setattr(module, leaf, swap(child))
            done.kinds[leaf] += 1
        return done


@dataclass
class FourBitSwapped(Swapped):
    in_fp8: Counter[str] = field(default_factory=Counter)
    """Kinds whose 4-bit products are dequantised into FP8 (the widths allow it)."""


@dataclass(frozen=True)
class FourBitBase:
    quant_type: str
    double_quant: bool
    fp8: Fp8Recipe | None = None
    arrived: ArrivedFourBit | None = None

    def convert(self, model: Decoder) -> FourBitSwapped:
        try:
            import bitsandbytes  # noqa: F401
        except ImportError:
            raise TuneforgeError(
                "model.quantize holds the base in 4 bits with bitsandbytes, which is not "
                "installed: pip install 'tuneforge[qlora]' (or bitsandbytes), or drop "
                "model.quantize"
            ) from None
        arrived = dict(self.arrived or {})
        done = FourBitSwapped()
        for parent, attribute, leaf, linear in list(frozen_linears(model)):
            low = arrived.pop(linear, None)
            low = low or Bnb4bitLinear(linear, self.quant_type, self.double_quant)
            setattr(parent, attribute, low)
            done.kinds[leaf] += 1
            if self.fp8 is not None and fits_scaled_mm(linear.in_features, linear.out_features):
                low.compute_in_fp8(self.fp8)
                done.in_fp8[leaf] += 1
            done.bytes_before += linear.weight.numel() * linear.weight.element_size()
            done.bytes_after += low.weight_bytes()
        if arrived:  # read in 4 bits, but trained: its weight is only a placeholder
            name = next(n for n, m in model.layers.named_modules() if m in arrived)
            raise TuneforgeError(
                f"model.quantize: layers.{name} trains in full (lora.modules_to_save?), and "
                "its weight was read in 4 bits: leave the decoder blocks' projections out of "
                "modules_to_save with a 4-bit base"
            )
        return done
