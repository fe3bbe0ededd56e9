"""The training loop: `setup`, `train`, `save` — one readable recipe, no framework trainer."""

import logging
import math
import random
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.distributed as dist

from tuneforge.config import RunConfig, advisories, dump_config
from tuneforge.data.dataset import DatasetStats
from tuneforge.data.records import DataError
from tuneforge.data.training_data import TrainingData
from tuneforge.errors import TuneforgeError
from tuneforge.hardware.cpu import choose_cpu_threads
from tuneforge.hardware.gpus import peak_tflops
from tuneforge.parallel.distributed import barrier, init_distributed
from tuneforge.peft.selection import lora_shape
from tuneforge.runs.files import CONFIG_FILE, FINISHED_FILE
from tuneforge.runs.outputs import save_base, save_final
from tuneforge.runs.pace import WARMUP_STEPS
from tuneforge.runs.projection import project
from tuneforge.runs.run_dir import (
    changed_settings,
    check_resume,
    prepare_run_dir,
    record_changes,
    replacing,
    run_settings,
)
from tuneforge.runs.time_budget import Deadline, StopSignals, find_deadline, training_share
from tuneforge.train.build import build_model
from tuneforge.train.device_watch import DeviceWatch
from tuneforge.train.evaluate import AccuracyResult, EvalResult, evaluate_loss, exact_match
from tuneforge.train.frozen.passes import FrozenPassData
from tuneforge.train.layout_choice import choose_dims
from tuneforge.train.metrics import MetricsLog, StepLog
from tuneforge.train.objectives.component import ObjectiveSetup
from tuneforge.train.objectives.registry import component_of
from tuneforge.train.objectives.seam import objective_of
from tuneforge.train.optim import learning_rate
from tuneforge.train.pending import PendingStep
from tuneforge.train.planned_pace import planned_pace
from tuneforge.train.preflight import Inputs, preflight
from tuneforge.train.prepare import prepare_model
from tuneforge.train.progress import Progress
from tuneforge.train.save_resume import (
    LoopState,
    load_intact,
    read_loop_state,
    save_checkpoint,
)
from tuneforge.train.step import StepRunner
from tuneforge.train.step_events import EventSchedule
from tuneforge.train.stopping import StopCheck

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
    losses: list[float] = field(default_factory=list)
    """Each step's training loss, this job's steps (a resumed run's from where it resumed)."""
    processes: int = 1
    finished_before: bool = False
    """Nothing was run: the run had finished before (`resume`)."""


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
        check_resume(resume, overwrite)
        self.config = config
        self.run_dir = Path(config.run.directory)
        self.overwrite = overwrite
        self.resume = resume
        self.force = force

    def setup(self) -> None:
        """The process group, the run directory, and everything the steps need."""
        config = self.config
        self.world = init_distributed(config.parallel.nccl_max_channels)
        self.device = self.world.device
        if self.device.type == "cpu":
            threads = choose_cpu_threads(self.world.world_size)
            torch.set_num_threads(threads.threads)
            log.info(threads.describe())
        # before anything is made: a refusal leaves nothing on disk (config validate runs it too)
        checked = preflight(config, self.world)
        for advisory in advisories(config):
            log.warning(advisory)
        replaced = self.overwrite and (self.run_dir / CONFIG_FILE).exists()
        made = not self.run_dir.exists()
        checkpoint = self._prepare_run_dir()
        # a setup that stops (a model that does not load, Ctrl-C) brings the old run back, or
        # leaves no directory where there was none
        with replacing(self.run_dir, self.world.is_main, replaced, made):
            self._build(checkpoint, checked)

    def _build(self, checkpoint: Path | None, checked: Inputs) -> None:
        """Model, adapters, wrappers, optimizer and the first files of the run, with the
        tokenizer and data the preflight read."""
        config = self.config
        seed = config.train.seed
        torch.manual_seed(seed)
        random.seed(seed)
        np.random.seed(seed)
        self.tokenizer = checked.tokenizer
        assert checked.data is not None
        self.train_stats = self._take_data(checked.data)
        self.dims = choose_dims(config, self.world, self.train_stats.records)
        # only the first rank projects the run's time
        main = self.world.is_main
        self.planned = planned_pace(config, self.world, self.train_stats.records) if main else None
        self.model, arrived = build_model(config.model, self.device, seed)
        self.base_model = str(config.model.path) if config.model.path else ""
        if config.lora.enabled and config.model.path is None:  # the adapter's base, saved once
            self.base_model = str(self.run_dir / "base")
            if checkpoint is None and self.world.is_main:
                save_base(self.run_dir, self.model, self.tokenizer)
        passes = FrozenPassData(self.loader, self.eval_batches, self.run_dir, self.world, config)
        resumed = read_loop_state(checkpoint).objective if checkpoint is not None else None
        setup = ObjectiveSetup(
            config, self.model, self.device, passes, resumed=resumed, tokenizer=self.tokenizer
        )
        prepared = prepare_model(config, self.model, self.world, self.dims, setup, arrived)
        self.objective, self.optimizer = prepared.objective, prepared.optimizer
        self.data_group = prepared.data_group
        self.total_steps = self._total_steps()
        self.metrics = MetricsLog.of(config, self.run_dir) if self.world.is_main else None
        self.progress = Progress()
        self.resumed_from = 0
        if checkpoint is not None:
            self._resume(checkpoint)
        elif self.world.is_main:
            (self.run_dir / CONFIG_FILE).write_text(dump_config(config))
        # after the resume: a captured step keeps the optimizer's state tensors
        self.queue_step = StepRunner(
            self.objective, self.model, self.optimizer, config.train, self.device, self.data_group
        )

    def _prepare_run_dir(self) -> Path | None:
        return prepare_run_dir(
            self.run_dir, self.resume, self.overwrite, self.world.is_main, barrier
        )

    def _take_data(self, data: TrainingData) -> DatasetStats:
        self.loader = data.loader
        self.eval_batches = data.eval_batches
        # exact match against replies to learn only (not a KTO record's undesirable one), of
        # a model that writes them (not a reward model)
        writes = component_of(self.config).declaration.writes_replies
        self.eval_conversations = [
            c for c in data.eval_conversations if writes and c.desirable is not False
        ]
        return data.stats

    def _resume(self, checkpoint: Path) -> None:
        changed = changed_settings(read_loop_state(checkpoint).settings, self.config)
        if changed and not self.force:
            raise TuneforgeError(
                f"resuming {checkpoint} would change settings the run's schedule or memory "
                f"depends on ({'; '.join(changed)}): restore them, or pass --force to resume "
                "with the new values (config.yaml then records the change)"
            )
        state, checkpoint = load_intact(
            checkpoint, self.objective, self.optimizer, self.world, fall_back=self.resume == "auto"
        )
        if changed and self.world.is_main:
            record_changes(self.run_dir, self.config, state.step, changed)
        try:
            self.loader.load_state_dict(dict(state.loader), state.world_size)
        except DataError as error:
            raise DataError(f"resuming {checkpoint}: {error}") from None
        self.progress = Progress(
            step=state.step,
            tokens_seen=state.tokens_seen,
            nonfinite_steps=state.nonfinite_steps,
            elapsed_before=state.elapsed_s,
        )
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
        if samples and self.eval_conversations and not self.dims.sharded:
            accuracy = exact_match(
                self.model,
                self.tokenizer,
                self.eval_conversations[:samples],
                self.config.eval.max_new_tokens,
            )
        record: dict[str, Any] = {"step": step}
        if loss is not None:
            record["eval_loss"] = loss.loss
            if component_of(self.config).declaration.per_token_loss:
                record["eval_ppl"] = loss.perplexity
            record |= {f"eval_{name}": value for name, value in loss.metrics.items()}
        if accuracy is not None and not accuracy.num_total:
            accuracy = None  # no held-out record has a reply to compare
        if accuracy is not None:
            record["eval_accuracy"] = accuracy.accuracy
        if self.metrics is not None:
            self.metrics.write(record)
        return Evaluation(step, loss, accuracy)

    def _loop_state(self, elapsed: float) -> LoopState:
        progress = self.progress
        return LoopState(
            step=progress.step,
            tokens_seen=progress.tokens_seen,
            loader=self.loader.state_dict(),
            elapsed_s=elapsed,
            world_size=self.dims.data_parallel_size,
            settings=run_settings(self.config),
            nonfinite_steps=progress.nonfinite_steps,
            objective=objective_of(self.objective).resume_state(),
        )

    def train(
        self,
        on_step: Callable[[dict[str, Any]], None] | None = None,
        on_eval: Callable[[Evaluation], None] | None = None,
    ) -> TrainSummary:
        """Run the steps left; `on_step` gets each step's metrics line, `on_eval` each evaluation."""
        progress, config = self.progress, self.config
        summary = TrainSummary(
            self.run_dir, progress.step, float("nan"), resumed_from=self.resumed_from
        )
        summary.skipped_steps = progress.nonfinite_steps
        if self.eval_batches and progress.step == 0:
            self._evaluate(0, summary, on_eval)
        step_log = self._step_log()
        deadline = find_deadline(config.train.time_limit, step_log.started)
        if deadline.at is not None and self.world.is_main:
            log.info("time limit: %s, %.0f s from now", deadline.source, deadline.remaining())

        def on_read(result: dict[str, Any], step: int, step_s: float) -> None:
            record = step_log.record(result, step, step_s, progress)
            summary.steps, summary.final_loss = step, result["loss"]
            summary.skipped_steps = progress.nonfinite_steps
            if on_step:
                on_step(record)

        pending = PendingStep(on_read, self.device)
        events = EventSchedule(config, self.total_steps, bool(self.eval_batches))
        batches = iter(self.loader)
        self.objective.train()
        with StopSignals() as signals:
            stop_check = StopCheck(config, signals, deadline, step_log.pace, self.device)
            while progress.step < self.total_steps:
                pending.before_queue()
                lr = learning_rate(progress.step, self.total_steps, config.train)
                queued = self.queue_step(batches, lr)
                progress.step += 1
                due = events.at(progress.step)
                pending.push(queued, progress.step)
                if due.read_now or self.device.type == "cpu":
                    pending.read()
                stop = stop_check(due.read_now, progress, pending.read)
                if due.project and self.world.is_main:
                    self._project(step_log, deadline)
                if due.evaluate:
                    self._evaluate(progress.step, summary, on_eval)
                if not due.last and (due.save or stop in ("time limit", "signal")):
                    self._save_checkpoint(step_log.elapsed(progress))
                if stop is not None and not due.last:
                    summary.stopped = stop
                    log.warning("stopping at step %d (%s)", progress.step, stop)
                    if stop == "time limit":
                        log.info(training_share(deadline))
                    return summary
        if self.eval_batches:
            self._evaluate(self.total_steps, summary, on_eval)
        return summary

    def _step_log(self) -> StepLog:
        lora = lora_shape(self.config.lora, self.model.args)
        watch = DeviceWatch(self.device, self.world.rank, self.progress.step + WARMUP_STEPS)
        peak = peak_tflops(self.device, self.config.logging.peak_tflops)
        return StepLog(
            self.config,
            self.model.args,
            lora,
            self.world.world_size,
            self.total_steps,
            self.metrics,
            watch,
            peak,
        )

    def _evaluate(
        self, step: int, summary: TrainSummary, on_eval: Callable[[Evaluation], None] | None
    ) -> None:
        summary.evaluations.append(self.evaluate(step))
        if on_eval:
            on_eval(summary.evaluations[-1])

    def _project(self, step_log: StepLog, deadline: Deadline) -> None:
        step, elapsed = self.progress.step, step_log.elapsed(self.progress)
        for level, line in project(
            step, self.total_steps, elapsed, step_log.pace, deadline, step_log.started,
            self.config, planned=self.planned,
        ):  # fmt: skip
            log.log(level, line)

    def _save_checkpoint(self, elapsed: float) -> None:
        _, seconds = save_checkpoint(
            self.run_dir,
            self.objective,
            self.optimizer,
            self._loop_state(elapsed),
            self.world,
            self.config.checkpoint.keep_last,
        )
        self.progress.checkpoint_s = max(self.progress.checkpoint_s or 0.0, seconds)
        log.info("checkpoint of step %d written in %.1f s", self.progress.step, seconds)

    def save(self) -> Path | None:
        """The final weights (or adapter); marks the run finished."""
        out, main = None, self.world.is_main
        if self.config.checkpoint.save_final:
            model, dtype = self.model, self.config.model.dtype  # FSDP2's fp32 masters rounded
            out = save_final(self.run_dir, model, self.tokenizer, self.base_model, main, dtype)
        if self.world.is_main:
            (self.run_dir / FINISHED_FILE).write_text(f"{self.progress.step}\n")
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
