"""The reference a preference objective compares against (DPO's, KTO's), held as its
configuration chose (`config/objectives/reference.py`): for a fresh adapter the base with the
adapters disabled (no second copy of the model), otherwise a frozen copy, or its values computed
in one pass before training."""

from tuneforge.train.frozen.precomputed_reference import precomputed_reference
from tuneforge.train.objectives.component import ObjectiveSetup
from tuneforge.train.objectives.pairs import Reference, starting_model


def reference_of(setup: ObjectiveSetup, kind: str | None) -> Reference | None:
    """The reference held as `kind` (None: the loss needs none)."""
    if kind is None:
        return None
    if kind == "precomputed":
        assert setup.passes is not None, "a precomputed reference needs the training data"
        return precomputed_reference(
            setup.model, setup.passes, setup.config.train.loss_chunk_tokens, setup.resumed
        )
    return starting_model(setup.model, kind, setup.dims.sharded)
