"""The demo shape's loss curve against a committed golden one (as torchtitan keeps
`tests/assets/losses`): a silent change of numerics — the loss's normalisation, the labels'
shift, masking, initialisation, the optimizer — fails here even where the loss still falls.

Regenerate after a deliberate change with `TUNEFORGE_WRITE_GOLDEN=1 pytest tests/unit/test_golden_loss.py`
and say why in the commit."""

import json
import os
from pathlib import Path

import pytest

from tests.helpers import QUIET_DEMO, train_demo

REPO = Path(__file__).resolve().parents[2]
GOLDEN = REPO / "tests" / "assets" / "losses" / "demo.json"
STEPS = 30
OVERRIDES = [
    f"train.max_steps={STEPS}",
    "train.tokens_per_micro_batch=512",
    *QUIET_DEMO,
]
RTOL = 2e-3
"""CPU kernels round differently by instruction set and thread count; a numerics change moves
the curve by far more."""


def demo_losses(run_dir: Path) -> list[float]:
    return [r["loss"] for r in train_demo(run_dir, OVERRIDES) if "loss" in r]


def test_the_demo_follows_its_golden_loss_curve(tmp_path):
    losses = demo_losses(tmp_path / "run")
    assert len(losses) == STEPS
    if os.environ.get("TUNEFORGE_WRITE_GOLDEN"):
        GOLDEN.parent.mkdir(parents=True, exist_ok=True)
        GOLDEN.write_text(json.dumps({"steps": STEPS, "losses": losses}, indent=1) + "\n")
    golden = json.loads(GOLDEN.read_text())["losses"]
    assert losses == pytest.approx(golden, rel=RTOL), [
        (step, got, want) for step, (got, want) in enumerate(zip(losses, golden, strict=True), 1)
    ]
    assert losses[-1] < 0.5 * losses[0]  # and it learns
