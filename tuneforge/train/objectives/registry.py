"""Every objective's component by `train.objective`: the one place that lists them on the
training side (`config/objectives/registry.py` lists their declarations)."""

from tuneforge.config.schema import RunConfig
from tuneforge.train.objectives import distill, dpo, grpo, kto, orpo, reward, sft
from tuneforge.train.objectives.component import ObjectiveComponent, ObjectiveSetup
from tuneforge.train.objectives.seam import Objective

COMPONENTS: dict[str, ObjectiveComponent] = {
    component.declaration.name: component
    for component in (
        sft.COMPONENT,
        dpo.COMPONENT,
        distill.COMPONENT,
        orpo.COMPONENT,
        grpo.COMPONENT,
        kto.COMPONENT,
        reward.COMPONENT,
    )
}


def component_of(config: RunConfig) -> ObjectiveComponent:
    return COMPONENTS[config.train.objective]


def build_objective(setup: ObjectiveSetup) -> Objective:
    """The objective the run trains with, its frozen models made (a precomputed reference or
    a cached teacher runs its pass here)."""
    return component_of(setup.config).build(setup)
