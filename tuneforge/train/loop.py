"""The training loop: `setup`, `train`, `save` — one readable recipe, no framework trainer."""

import logging
import math
import random
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from tuneforge.config import RunConfig, dump_config
from tuneforge.data.dataset import DatasetStats
from tuneforge.errors import TuneforgeError
from tuneforge.models.cost import training_flops_per_token
from tuneforge.peft.apply import LoraReport, apply_lora
from tuneforge.peft.stacked_weights import stack_frozen_weights
from tuneforge.peft.targets import LoraTargetError
from tuneforge.train.block_wrappers import refuse_unsupported_offload, wrap_blocks
from tuneforge.train.build import build_model, load_data, load_tokenizer
from tuneforge.train.captured_step import step_function
from tuneforge.train.checkpoint import (
    LoopState,
    load_checkpoint,
    read_loop_state,
    save_checkpoint,
)
from tuneforge.train.distributed import (
    barrier,
    init_distributed,
    parallelize,
    strategy_of,
    unwrap,
)
from tuneforge.train.evaluate import AccuracyResult, EvalResult, evaluate_loss, exact_match
from tuneforge.train.hardware import DeviceWatch, peak_tflops
from tuneforge.train.host_embedding import embedding_to_host
from tuneforge.train.metrics import WARMUP_STEPS, MetricsLog, Pace, step_record
from tuneforge.train.objective import NextTokenObjective
from tuneforge.train.optim import build_optimizer, learning_rate
from tuneforge.train.outputs import save_base, save_final
from tuneforge.train.projection import project
from tuneforge.train.run_dir import (
    CONFIG_FILE,
    FINISHED_FILE,
    METRICS_FILE,
    TENSORBOARD_DIR,
    changed_settings,
    memory_settings,
    prepare_run_dir,
    replacing,
)
from tuneforge.train.step import HostValues, StepResult
from tuneforge.train.stopping import STOP_REASONS, agree_on_stop, local_stop_code
from tuneforge.train.strategy_choice import choose_strategy
from tuneforge.train.time_budget import StopSignals, find_deadline

log = logging.getLogger(__name__)


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
    stopped: str | None = None
    """Why the run stopped before its last step: `time limit`, `signal` or `non-finite`."""
    resumed_from: int = 0


class Trainer:
    def __init__(
        self,
        config: RunConfig,
        overwrite: bool = False,
        resume: str = "never",
        force: bool = False,
    ) -> None:
        """`resume`: `never`, `auto` (the newest complete checkpoint, if any) or a checkpoint
        directory. `force` lets a resume change memory-critical settings."""
        if overwrite and resume != "never":
            raise TuneforgeError("--overwrite and --resume exclude each other")
        self.config = config
        self.run_dir = Path(config.run.directory)
        self.overwrite = overwrite
        self.resume = resume
        self.force = force

    def setup(self) -> None:
        config = self.config
        self._refuse_unsupported()
        self.world = init_distributed(config.parallel.nccl_max_channels)
        self.device = self.world.device
        strategy_of(config.parallel, self.world)  # refuses `single` on several processes early
        replaced = self.overwrite and (self.run_dir / CONFIG_FILE).exists()
        checkpoint = self._prepare_run_dir()
        with replacing(self.run_dir, self.world, replaced):  # a setup that stops: the old run back
            self._build(checkpoint)

    def _build(self, checkpoint: Path | None) -> None:
        """Data, model, adapters, wrappers, optimizer and the first files of the run."""
        config = self.config
        seed = config.train.seed
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        self.tokenizer = load_tokenizer(config)
        self.train_stats = self._load_data()
        self.strategy = choose_strategy(config, self.world, self.train_stats.raw_lengths)
        self.model = build_model(config.model, self.device, seed)
        if len(self.tokenizer) > self.model.args.vocab_size:
            raise TuneforgeError(
                f"the tokenizer has {len(self.tokenizer)} tokens but the model's vocabulary holds "
                f"{self.model.args.vocab_size}: use the model's own tokenizer"
            )
        self.base_model = str(config.model.path) if config.model.path else ""
        self.lora_report = self._apply_lora(fresh=checkpoint is None)
        train = config.train
        refuse_unsupported_offload(train, self.world.world_size, self.model.args)
        if train.offload_embedding:
            embedding_to_host(self.model, self.world.world_size)
        wrap_blocks(
            self.model,
            train.activation_checkpointing,
            train.checkpoint_every,
            train.compile,
            train.offload_checkpoints,
            train.compile_memory_budget,
            train.offload_activations,
            train.keep_activations,
        )
        self.objective = parallelize(
            NextTokenObjective(self.model, train.loss_chunk_tokens, train.compile),
            self.model.layers,
            self.strategy,
            config.parallel,
            self.world,
        )
        stack_frozen_weights(self.model)  # where unsharded: q, k and v as one GEMM
        self.optimizer = build_optimizer(self.model, train, self.device)
        self.total_steps = self._total_steps()
        tensorboard = self.run_dir / TENSORBOARD_DIR if config.logging.tensorboard else None
        self.metrics = (
            MetricsLog(self.run_dir / METRICS_FILE, tensorboard) if self.world.is_main else None
        )
        self.step, self.tokens_seen, self.nonfinite_steps, self.elapsed_before = 0, 0, 0, 0.0
        self.resumed_from = 0
        if checkpoint is not None:
            self._resume(checkpoint)
        elif self.world.is_main:
            (self.run_dir / CONFIG_FILE).write_text(dump_config(config))
        self.peak_tflops = peak_tflops(self.device, config.logging.peak_tflops)
        try:  # after the resume: a captured step keeps the optimizer's state tensors
            self.queue_step = step_function(
                self.objective, self.model, self.optimizer, train, self.device
            )
        except ValueError as error:
            raise TuneforgeError(f"{error}: drop train.cuda_graph") from None

    def _refuse_unsupported(self) -> None:
        precision = self.config.precision
        if precision.fp8 or precision.fp4:
            raise TuneforgeError(
                "precision.fp8 / precision.fp4 training is not available in this version"
            )

    def _prepare_run_dir(self) -> Path | None:
        return prepare_run_dir(self.run_dir, self.resume, self.overwrite, self.world)

    def _load_data(self) -> DatasetStats:
        data = load_data(self.config, self.tokenizer, self.world)
        self.loader = data.loader
        self.eval_batches = data.eval_batches
        self.eval_conversations = data.eval_conversations
        return data.stats

    def _apply_lora(self, fresh: bool) -> LoraReport:
        lora = self.config.lora
        if lora.enabled and self.config.model.path is None:
            base = self.run_dir / "base"
            if fresh and self.world.is_main:
                save_base(self.run_dir, self.model, self.tokenizer)
            self.base_model = str(base)
        generator = torch.Generator(device=self.device).manual_seed(self.config.train.seed + 1)
        try:
            apply_lora(self.model, lora, generator, torch.float32)
        except LoraTargetError as error:
            raise TuneforgeError(str(error)) from None
        report: LoraReport = self.model.lora_report
        report.log(log)
        return report

    def _resume(self, checkpoint: Path) -> None:
        changed = changed_settings(read_loop_state(checkpoint).settings, self.config)
        if changed and not self.force:
            raise TuneforgeError(
                f"resuming {checkpoint} would change settings the run's memory depends on "
                f"({'; '.join(changed)}): restore them, or pass --force to resume anyway"
            )
        state = load_checkpoint(checkpoint, self.objective, self.optimizer, self.world)
        try:
            self.loader.load_state_dict(dict(state.loader), state.world_size)
        except ValueError as error:
            raise TuneforgeError(f"resuming {checkpoint}: {error}") from None
        self.step, self.tokens_seen = state.step, state.tokens_seen
        self.nonfinite_steps, self.elapsed_before = state.nonfinite_steps, state.elapsed_s
        self.resumed_from = state.step
        if self.metrics is not None:
            self.metrics.truncate_after(state.step)
        log.info("resumed from %s (step %d)", checkpoint, state.step)

    def _total_steps(self) -> int:
        train = self.config.train
        if train.max_steps is not None:
            return train.max_steps
        assert train.epochs is not None
        return max(1, math.ceil(train.epochs * len(self.loader) / train.grad_accum_steps))

    def evaluate(self, step: int) -> Evaluation:
        loss = (
            evaluate_loss(self.objective, self.eval_batches, self.device)
            if self.eval_batches
            else None
        )
        accuracy = None
        samples = self.config.eval.num_samples
        if samples and self.eval_conversations and self.strategy != "fsdp":
            accuracy = exact_match(
                unwrap(self.objective).model,
                self.tokenizer,
                self.eval_conversations[:samples],
                self.config.eval.max_new_tokens,
            )
        record: dict[str, Any] = {"step": step}
        if loss is not None:
            record |= {"eval_loss": loss.loss, "eval_ppl": loss.perplexity}
        if accuracy is not None:
            record["eval_accuracy"] = accuracy.accuracy
        if self.metrics is not None:
            self.metrics.write(record)
        return Evaluation(step, loss, accuracy)

    def _loop_state(self, elapsed: float) -> LoopState:
        return LoopState(
            step=self.step,
            tokens_seen=self.tokens_seen,
            loader=self.loader.state_dict(),
            elapsed_s=elapsed,
            world_size=self.world.world_size,
            settings=memory_settings(self.config),
            nonfinite_steps=self.nonfinite_steps,
        )

    def train(
        self,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        on_eval: Callable[[Evaluation], None] | None = None,
    ) -> TrainSummary:
        config = self.config
        train = config.train
        summary = TrainSummary(
            self.run_dir, self.step, float("nan"), resumed_from=self.resumed_from
        )
        summary.skipped_steps = self.nonfinite_steps

        def evaluate(step: int) -> None:
            summary.evaluations.append(self.evaluate(step))
            if on_eval:
                on_eval(summary.evaluations[-1])

        if self.eval_batches and self.step == 0:
            evaluate(0)
        started = time.time()
        deadline = find_deadline(train.time_limit, started)
        if deadline.at is not None and self.world.is_main:
            log.info("time limit: %s, %.0f s from now", deadline.source, deadline.remaining())
        pace = Pace()
        checkpoint_s: float | None = None
        nonfinite_in_row = 0
        lora_shape = self.lora_report.shape(self.config.lora) if self.config.lora.enabled else None
        batches = iter(self.loader)
        # A step's numbers are read once the next step is queued, so the GPU never waits for
        # the host between steps; a step that the loop acts on (evaluation, checkpoint, stop,
        # the last one) is read before anything else is queued. A step's time runs from the
        # previous step's numbers read (or its own start, when nothing was queued before it)
        # to its own numbers read: in steady state, the period. On the CPU a step runs as it is
        # queued, so it is read at once (read later, the last step would seem to take no time).
        pending: tuple[StepResult, int] | None = None
        agreed_stop: HostValues | None = None
        last_read = time.perf_counter()
        device_watch = DeviceWatch(self.device, self.world.rank, self.step + WARMUP_STEPS)

        def finish(queued: tuple[StepResult, int]) -> None:
            nonlocal nonfinite_in_row, last_read
            result, step = queued[0].get(), queued[1]
            now = time.perf_counter()
            step_s, last_read = now - last_read, now
            pace.add(step_s)
            self.tokens_seen += result["tokens"]
            if not result["finite"]:
                self.nonfinite_steps += 1
                nonfinite_in_row += 1
                log.warning("step %d: non-finite loss or gradient norm; update skipped", step)
            else:
                nonfinite_in_row = 0
            elapsed = self.elapsed_before + time.time() - started
            flops = training_flops_per_token(
                self.model.args, round(result["mean_doc_len"]), lora_shape
            )
            record = step_record(
                step,
                result,
                step_s,
                tflops=result["tokens"] / step_s * flops / self.world.world_size / 1e12,
                peak_tflops=self.peak_tflops,
                elapsed_s=elapsed,
                eta_s=pace.eta_s(self.total_steps - step),
                checkpoint_s=checkpoint_s,
                nonfinite_steps=self.nonfinite_steps,
            ) | device_watch.check(step)
            summary.steps, summary.final_loss = step, result["loss"]
            summary.skipped_steps = self.nonfinite_steps
            if self.metrics is not None and (
                step % config.logging.log_steps == 0 or step == self.total_steps
            ):
                self.metrics.write(record)
            if on_step:
                on_step(record)

        self.objective.train()
        with StopSignals() as signals:
            while self.step < self.total_steps:
                if pending is None:
                    last_read = time.perf_counter()
                lr = learning_rate(self.step, self.total_steps, train)
                queued = self.queue_step(batches, lr)
                self.step += 1
                if pending is not None:
                    finish(pending)
                pending = (queued, self.step)
                save_steps = config.checkpoint.save_steps
                periodic = save_steps is not None and self.step % save_steps == 0
                evaluating = bool(
                    self.eval_batches
                    and train.eval_steps
                    and self.step % train.eval_steps == 0
                    and self.step < self.total_steps
                )
                scheduled = (
                    periodic
                    or evaluating
                    or train.on_nonfinite == "stop"
                    or self.step in (self.total_steps, config.logging.projection_step)
                )
                if scheduled or self.device.type == "cpu":
                    finish(pending)
                    pending = None
                code = local_stop_code(
                    config, signals, deadline, pace, checkpoint_s, nonfinite_in_row
                )
                if dist.is_initialized():  # every rank stops at the same step
                    code, agreed_stop = agree_on_stop(code, agreed_stop, scheduled, self.device)
                if code and pending is not None:
                    finish(pending)
                    pending = None
                    if not dist.is_initialized():  # the step just read may add a reason
                        code = local_stop_code(
                            config, signals, deadline, pace, checkpoint_s, nonfinite_in_row
                        )
                if self.step == config.logging.projection_step and self.world.is_main:
                    elapsed = self.elapsed_before + time.time() - started
                    for level, line in project(
                        self.step, self.total_steps, elapsed, pace, deadline, started, config
                    ):
                        log.log(level, line)
                if evaluating:
                    evaluate(self.step)
                stop = STOP_REASONS[code]
                if self.step < self.total_steps and (periodic or stop in ("time limit", "signal")):
                    _, seconds = save_checkpoint(
                        self.run_dir,
                        self.objective,
                        self.optimizer,
                        self._loop_state(self.elapsed_before + time.time() - started),
                        self.world,
                        config.checkpoint.keep_last,
                    )
                    checkpoint_s = max(checkpoint_s or 0.0, seconds)
                    log.info("checkpoint of step %d written in %.1f s", self.step, seconds)
                if stop is not None and self.step < self.total_steps:
                    summary.stopped = stop
                    log.warning("stopping at step %d (%s)", self.step, stop)
                    return summary
        if self.eval_batches:
            evaluate(self.total_steps)
        return summary

    def save(self) -> Path | None:
        """The final weights (or adapter); marks the run finished."""
        out = None
        if self.config.checkpoint.save_final:
            out = save_final(
                self.run_dir, self.model, self.tokenizer, self.base_model, write=self.world.is_main
            )
        if self.world.is_main:
            (self.run_dir / FINISHED_FILE).write_text(f"{self.step}\n")
            if self.metrics is not None:
                self.metrics.close()
        barrier()
        return out

    def close(self) -> None:
        """Release what setup took (it may have stopped half-way)."""
        metrics = getattr(self, "metrics", None)
        if metrics is not None:
            metrics.close()
        if dist.is_initialized():
            dist.destroy_process_group()
