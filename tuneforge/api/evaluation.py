"""`tuneforge.evaluate(...)`: a trained run's held-out cross-entropy per reply token and the
exact match of its greedy replies, on its held-out data or on another file of conversations."""

from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from tuneforge.errors import TuneforgeError

if TYPE_CHECKING:
    from tuneforge.train.evaluate import AccuracyResult


@dataclass
class RunEvaluation:
    loss: float
    """Mean cross-entropy per supervised reply token (whatever the run's objective was)."""
    tokens: int
    """The supervised tokens it is averaged over."""
    exact_match: "AccuracyResult | None"
    """Greedy replies against the references (None with `num_samples=0`)."""


def evaluate(
    run: str | Path,
    data: str | Path | None = None,
    *,
    num_samples: int | None = None,
    max_new_tokens: int | None = None,
) -> RunEvaluation:
    """Evaluate the trained weights of `run` on its held-out data (its `data.eval`, or the
    fraction it held out), or on `data` (a file of conversations, or preference pairs read by
    their chosen reply). `num_samples` prompts are answered for exact match (default: the
    run's `eval.num_samples`)."""
    from tuneforge.api.configuration import config
    from tuneforge.runs.files import CONFIG_FILE

    run_dir = Path(run)
    if not (run_dir / CONFIG_FILE).is_file():
        raise TuneforgeError(f"{run_dir} is no run directory (no {CONFIG_FILE})")
    # the replies' cross-entropy: the next-token objective, whatever the run optimised
    changes: dict[str, object] = {"train__objective": "sft"}
    if data is not None:
        if not Path(data).is_file():
            raise TuneforgeError(f"{data}: no such data file")
        changes |= {
            "data__eval": [{"path": str(Path(data).resolve())}],
            "data__eval_fraction": None,
        }
    saved = config(run_dir / CONFIG_FILE)
    if saved.train.objective == "reward":
        raise TuneforgeError(
            f"{run_dir} is a reward model: it scores replies rather than writing them; its "
            "held-out pairwise accuracy is in its metrics.jsonl (eval_reward_accuracy)"
        )
    loaded = config(saved, **changes)
    if not loaded.data.eval and loaded.data.eval_fraction is None:
        raise TuneforgeError(f"{run_dir} has no held-out data: pass data= a file to evaluate on")
    return _evaluated(run_dir, loaded, num_samples, max_new_tokens)


def _evaluated(run_dir: Path, loaded, num_samples: int | None, max_new_tokens: int | None):
    from tuneforge.data.training_data import load_training_data
    from tuneforge.hardware.gpus import pick_device
    from tuneforge.inference.trained import load_trained
    from tuneforge.train.evaluate import evaluate_loss, exact_match
    from tuneforge.train.objectives.sft import NextTokenObjective

    device = pick_device()
    model, tokenizer = load_trained(run_dir, device)
    held_out = load_training_data(
        loaded.data, tokenizer, loaded.train.tokens_per_micro_batch, loaded.train.seed
    )
    objective = NextTokenObjective(model, loaded.train.loss_chunk_tokens)
    loss = evaluate_loss(objective, held_out.eval_batches, device)
    samples = loaded.eval.num_samples if num_samples is None else num_samples
    accuracy = None
    if samples:
        new_tokens = max_new_tokens or loaded.eval.max_new_tokens
        conversations = held_out.eval_conversations[:samples]
        accuracy = exact_match(model, tokenizer, conversations, new_tokens)
    return RunEvaluation(loss.loss, loss.num_tokens, accuracy)
