"""`train.objective: sft`: next-token cross-entropy on the supervised tokens. It has no section
of its own and holds nothing frozen."""

from tuneforge.config.objectives.declaration import ObjectiveDeclaration

SFT = ObjectiveDeclaration(name="sft", summary="next-token cross-entropy on the supervised tokens")
