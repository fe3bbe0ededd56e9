"""`eval:` held-out evaluation."""

from pydantic import Field

from tuneforge.config.sections.base import Section


class EvalSection(Section):
    every_steps: int | None = Field(None, ge=1)
    """Evaluate held-out loss every N steps (and at the start and the end), so that the held-out
    curve has points between them."""
    num_samples: int = Field(0, ge=0)
    """Held-out prompts answered by greedy decoding for exact-match accuracy (0 disables)."""
    max_new_tokens: int = Field(32, ge=1)
    """Longest reply generated when measuring accuracy."""
