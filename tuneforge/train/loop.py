"""The training loop: `setup`, `train`, `save` — one readable recipe, no framework trainer."""

import functools
import logging
import math
import shutil
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.checkpoint import checkpoint

from tuneforge.config import RunConfig, dump_config
from tuneforge.data.dataset import DatasetStats
from tuneforge.data.records import DataError
from tuneforge.data.training_data import load_training_data
from tuneforge.errors import TuneforgeError
from tuneforge.models.decoder import Decoder
from tuneforge.peft.apply import LoraReport, apply_lora
from tuneforge.peft.targets import LoraTargetError
from tuneforge.train.build import build_model, load_tokenizer, pick_device
from tuneforge.train.checkpoint import save_base, save_final, save_step_checkpoint
from tuneforge.train.evaluate import AccuracyResult, EvalResult, evaluate_loss, exact_match
from tuneforge.train.loss import chunked_cross_entropy
from tuneforge.train.metrics import MetricsLog
from tuneforge.train.optim import build_optimizer, learning_rate

log = logging.getLogger(__name__)

CONFIG_FILE = "config.yaml"
METRICS_FILE = "metrics.jsonl"


@dataclass
class Evaluation:
    step: int
    loss: EvalResult | None
    accuracy: AccuracyResult | None


@dataclass
class TrainSummary:
    run_dir: Path
    steps: int
    final_loss: float
    evaluations: list[Evaluation] = field(default_factory=list)
    saved: Path | None = None
    skipped_steps: int = 0


def apply_activation_checkpointing(model: Decoder) -> None:
    """Recompute every block in backward; module names (and so checkpoints) stay unchanged."""
    for layer in model.layers:
        layer.forward = functools.partial(checkpoint, layer.forward, use_reentrant=False)


class Trainer:
    def __init__(self, config: RunConfig, overwrite: bool = False) -> None:
        self.config = config
        self.run_dir = Path(config.run.directory)
        self.overwrite = overwrite

    def setup(self) -> None:
        config = self.config
        self._refuse_unsupported()
        self._prepare_run_dir()
        self.device = pick_device()
        torch.manual_seed(config.train.seed)
        self.tokenizer = load_tokenizer(config)
        self.train_stats = self._load_data()
        self.model = build_model(config.model, self.device, config.train.seed)
        if len(self.tokenizer) > self.model.args.vocab_size:
            raise TuneforgeError(
                f"the tokenizer has {len(self.tokenizer)} tokens but the model's vocabulary holds "
                f"{self.model.args.vocab_size}: use the model's own tokenizer"
            )
        self.base_model = str(config.model.path) if config.model.path else ""
        self.lora_report = self._apply_lora()
        if config.train.activation_checkpointing == "full":
            apply_activation_checkpointing(self.model)
        self.optimizer = build_optimizer(self.model, config.train, self.device)
        self.total_steps = self._total_steps()
        self.metrics = MetricsLog(self.run_dir / METRICS_FILE)
        (self.run_dir / CONFIG_FILE).write_text(dump_config(config))

    def _refuse_unsupported(self) -> None:
        precision, parallel = self.config.precision, self.config.parallel
        if precision.fp8 or precision.fp4:
            raise TuneforgeError(
                "precision.fp8 / precision.fp4 training is not available in this version"
            )
        if parallel.strategy in ("ddp", "fsdp"):
            raise TuneforgeError(
                f"parallel.strategy={parallel.strategy} is not available in this version: use single"
            )

    def _prepare_run_dir(self) -> None:
        if (self.run_dir / CONFIG_FILE).exists():
            if not self.overwrite:
                raise TuneforgeError(
                    f"{self.run_dir} already holds a run: pick another run.name or run.output_dir, "
                    "or pass --overwrite to replace it"
                )
            shutil.rmtree(self.run_dir)
        self.run_dir.mkdir(parents=True, exist_ok=True)

    def _load_data(self) -> DatasetStats:
        train = self.config.train
        try:
            data = load_training_data(
                self.config.data, self.tokenizer, train.tokens_per_micro_batch, train.seed
            )
        except DataError as error:
            raise TuneforgeError(str(error)) from None
        self.loader = data.loader
        self.eval_batches = data.eval_batches
        self.eval_conversations = data.eval_conversations
        return data.stats

    def _apply_lora(self) -> LoraReport:
        lora = self.config.lora
        if lora.enabled and self.config.model.path is None:
            self.base_model = str(save_base(self.run_dir, self.model, self.tokenizer))
        generator = torch.Generator(device=self.device).manual_seed(self.config.train.seed + 1)
        try:
            apply_lora(self.model, lora, generator, torch.float32)
        except LoraTargetError as error:
            raise TuneforgeError(str(error)) from None
        report: LoraReport = self.model.lora_report
        for pattern, names in report.matched.items():
            log.info("LoRA %s: %d module(s), e.g. %s", pattern, len(names), names[0])
        if report.saved_modules:
            log.info(
                "trained in full and saved with the adapter: %s", ", ".join(report.saved_modules)
            )
        log.info(
            "trainable parameters: %d of %d (%.2f%%)",
            report.trainable_params,
            report.total_params,
            100 * report.trainable_share,
        )
        return report

    def _total_steps(self) -> int:
        train = self.config.train
        if train.max_steps is not None:
            return train.max_steps
        assert train.epochs is not None
        return max(1, math.ceil(train.epochs * len(self.loader) / train.grad_accum_steps))

    def evaluate(self, step: int) -> Evaluation:
        loss = (
            evaluate_loss(self.model, self.eval_batches, self.device) if self.eval_batches else None
        )
        accuracy = None
        samples = self.config.eval.num_samples
        if samples and self.eval_conversations:
            accuracy = exact_match(
                self.model,
                self.tokenizer,
                self.eval_conversations[:samples],
                self.config.eval.max_new_tokens,
            )
        record: dict[str, Any] = {"step": step}
        if loss is not None:
            record |= {"eval_loss": loss.loss, "eval_ppl": loss.perplexity}
        if accuracy is not None:
            record["eval_accuracy"] = accuracy.accuracy
        self.metrics.write(record)
        return Evaluation(step, loss, accuracy)

    def train(
        self,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        on_eval: Callable[[Evaluation], None] | None = None,
    ) -> TrainSummary:
        config = self.config
        train = config.train
        summary = TrainSummary(self.run_dir, 0, float("nan"))
        if self.eval_batches:
            summary.evaluations.append(self.evaluate(0))
            if on_eval:
                on_eval(summary.evaluations[-1])
        batches = iter(self.loader)
        params = [p for p in self.model.parameters() if p.requires_grad]
        self.model.train()
        start = time.perf_counter()
        for step in range(self.total_steps):
            step_start = time.perf_counter()
            lr = learning_rate(step, self.total_steps, train)
            for group in self.optimizer.param_groups:
                group["lr"] = lr
            micro_batches = [next(batches).to(self.device) for _ in range(train.grad_accum_steps)]
            # Normalise by the supervised tokens of the whole step: any split equals one big batch.
            step_loss_tokens = sum(batch.num_loss_tokens for batch in micro_batches)
            loss_total = 0.0
            for batch in micro_batches:
                hidden = self.model.hidden_states(batch.tokens, batch.packed)
                loss_sum, _ = chunked_cross_entropy(hidden, self.model.lm_head.weight, batch.labels)
                objective = loss_sum / step_loss_tokens
                aux = self.model.aux_loss()
                if aux is not None:  # MoE load balancing, averaged over the step's micro-batches
                    assert self.model.args.moe is not None
                    objective = objective + self.model.args.moe.router_aux_loss_coef * aux / len(
                        micro_batches
                    )
                objective.backward()
                loss_total += float(loss_sum.detach())
            loss = loss_total / max(step_loss_tokens, 1)
            max_norm = train.clip_grad_norm if train.clip_grad_norm is not None else float("inf")
            grad_norm = float(torch.nn.utils.clip_grad_norm_(params, max_norm))
            if math.isfinite(loss) and math.isfinite(grad_norm):
                self.optimizer.step()
            else:
                summary.skipped_steps += 1
                log.warning("step %d: non-finite loss or gradient norm; update skipped", step + 1)
            self.optimizer.zero_grad(set_to_none=True)
            num_tokens = sum(batch.num_real_tokens for batch in micro_batches)
            elapsed = time.perf_counter() - step_start
            record = {
                "step": step + 1,
                "loss": loss,
                "lr": lr,
                "grad_norm": grad_norm,
                "tokens": num_tokens,
                "loss_tokens": step_loss_tokens,
                "tokens_per_s": num_tokens / elapsed,
                "elapsed_s": time.perf_counter() - start,
            }
            summary.steps, summary.final_loss = step + 1, loss
            if (step + 1) % config.logging.log_steps == 0 or step + 1 == self.total_steps:
                self.metrics.write(record)
            if on_step:
                on_step(record)
            save_steps = config.checkpoint.save_steps
            if save_steps and (step + 1) % save_steps == 0 and step + 1 < self.total_steps:
                state = {"tokens_seen": record["tokens"], "epoch": self.loader.epoch}
                save_step_checkpoint(
                    self.run_dir, self.model, step + 1, state, config.checkpoint.keep_last
                )
            eval_steps = train.eval_steps
            if (
                self.eval_batches
                and eval_steps
                and (step + 1) % eval_steps == 0
                and step + 1 < self.total_steps
            ):
                summary.evaluations.append(self.evaluate(step + 1))
                if on_eval:
                    on_eval(summary.evaluations[-1])
        if self.eval_batches:
            summary.evaluations.append(self.evaluate(self.total_steps))
            if on_eval:
                on_eval(summary.evaluations[-1])
        return summary

    def save(self) -> Path | None:
        if not self.config.checkpoint.save_final:
            return None
        return save_final(self.run_dir, self.model, self.tokenizer, self.base_model)
