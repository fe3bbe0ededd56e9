"""What this machine must have for the run: the optional packages the configuration needs,
trackers that can log from here, and FP8 tensor cores where FP8 is asked for. `config
validate` says these apart: the configuration is valid, and this machine cannot run it."""

from tuneforge.config.errors import ConfigIssue
from tuneforge.config.packages import missing_packages
from tuneforge.errors import TuneforgeError
from tuneforge.train.preflight.check import Inputs
from tuneforge.train.trackers import tracker_problems


def fp8_issues(inputs: Inputs) -> list[ConfigIssue]:
    """FP8 asked for where this process's device has no FP8 tensor cores."""
    if not inputs.config.precision.fp8:
        return []  # no torch to import
    import torch

    from tuneforge.precision.refusals import refuse_unsupported_precision

    if inputs.world is not None:
        device = inputs.world.device
    else:
        device = torch.device("cuda", 0) if torch.cuda.is_available() else torch.device("cpu")
    try:
        refuse_unsupported_precision(inputs.config.precision, device, inputs.config.model)
    except TuneforgeError as error:
        return [ConfigIssue("precision.fp8", str(error))]
    return []


def machine_issues(inputs: Inputs) -> list[ConfigIssue]:
    config = inputs.config
    issues = [
        ConfigIssue(package.field, package.message().removeprefix(f"{package.field} "))
        for package in missing_packages(config)
    ]
    for problem in tracker_problems(config):
        issues.append(ConfigIssue("logging.report_to", problem.removeprefix("logging.report_to: ")))
    return issues + fp8_issues(inputs)
