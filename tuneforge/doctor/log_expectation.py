"""A scanned log's step time against the planner's for the run's configuration (`doctor log
--config`): the step-time model that `plan` and the step-25 projection use."""

from tuneforge.doctor.log_scan import Finding, LogReport
from tuneforge.plan.pace_check import PaceCheck
from tuneforge.plan.prediction import Plan


def compare_with_plan(report: LogReport, plan: Plan) -> None:
    """Record the planned step time in `report`, and a finding where the log's is much slower."""
    report.planned_step_s, report.planned_rates = plan.step_time_s, plan.rates
    if report.step_time_s is None:
        return
    check = PaceCheck(report.step_time_s, plan.step_time_s, plan.rates, plan.step_bound)
    if check.slow:
        report.findings.append(Finding("slower_than_planned", 1, check.describe(), check.advice()))
