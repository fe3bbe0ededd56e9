"""`tuneforge slurm`: the sbatch script of a chain of time-limited jobs that continue one run.

Every job runs the same script: a fixed run directory (from the configuration, never the job
id), `--resume auto`, the job's end time exported as `SLURM_JOB_END_TIME` (so the trainer saves
and exits before it, on any SLURM version), `--signal=B:USR1@margin` forwarded to the trainer,
and, once training has finished, the chain's remaining jobs cancelled. `submit.sh` queues the
jobs with `afterany` dependencies; `jobs.jsonl` in the run directory records each job's first
and last step.
"""

import shlex
import sys
from dataclasses import dataclass, field
from pathlib import Path

from tuneforge.config import RunConfig
from tuneforge.config.durations import parse_duration
from tuneforge.runs.files import JOBS_FILE
from tuneforge.runs.time_budget import EXIT_RESUME

SCRIPT = "train.sbatch"
SUBMIT = "submit.sh"
DEFAULT_ENV = {"PYTORCH_ALLOC_CONF": "expandable_segments:True"}
LATEST_STEP = (
    '"$PYTHON" -c "import json,sys; print(json.load(open(sys.argv[1]))[\'step\'])" '
    '"$RUN_DIR/checkpoints/latest" 2>/dev/null || echo 0'
)
"""The step of the newest complete checkpoint (0 before the first)."""


@dataclass(frozen=True)
class ChainSpec:
    config: Path
    overrides: list[str]
    jobs: int
    time: str
    nodes: int = 1
    gpus_per_node: int = 0
    partition: str | None = None
    account: str | None = None
    env: dict[str, str] = field(default_factory=dict)
    signal_margin_s: int = 120
    python: str = sys.executable
    """The interpreter the jobs run (the one tuneforge is installed in)."""
    procs_per_node: int | None = None
    """Training processes per node (default: one per GPU, or one on CPU nodes)."""

    @property
    def ranks_per_node(self) -> int:
        return self.procs_per_node or max(1, self.gpus_per_node)


def job_name(config: RunConfig) -> str:
    return f"tf-{config.run.name}"


def _sbatch_seconds(time: str) -> int:
    return int(parse_duration(time))


def _slurm_time(seconds: int) -> str:
    days, rest = divmod(seconds, 86400)
    text = f"{rest // 3600:02d}:{rest % 3600 // 60:02d}:{rest % 60:02d}"
    return f"{days}-{text}" if days else text


def train_command(spec: ChainSpec, run_dir: Path) -> str:
    """The trainer's command line; the run directory is pinned as an absolute path, so a job
    trains into it wherever `sbatch` was called from."""
    args = [
        "-m",
        "tuneforge",
        "train",
        str(spec.config.resolve()),
        *spec.overrides,
        f"run.output_dir={run_dir}",
        "--resume",
        "auto",
    ]
    quoted = " ".join(shlex.quote(a) for a in args)
    python, ranks = shlex.quote(spec.python), spec.ranks_per_node
    if spec.nodes > 1:
        # one torchrun per node, its rank SLURM's node id (expanded in each task, not here);
        # the first node's address and a port of this job form the rendezvous
        launcher = (
            f"{python} -m torch.distributed.run --nnodes=$SLURM_NNODES "
            f"--node_rank=$SLURM_NODEID --nproc_per_node={ranks} "
            f"--master_addr=$MASTER_ADDR --master_port=$MASTER_PORT {quoted}"
        )
        per_node = shlex.quote(_passing_usr1_to_ranks(launcher))
        return f"srun --ntasks-per-node=1 --kill-on-bad-exit=1 bash -c {per_node}"
    if ranks > 1:
        launcher = (
            f"{python} -m torch.distributed.run --standalone --nproc_per_node={ranks} {quoted}"
        )
        return f"bash -c {shlex.quote(_passing_usr1_to_ranks(launcher))}"
    return f"{python} {quoted}"


def _passing_usr1_to_ranks(launcher: str) -> str:
    """`launcher` (torchrun) in a shell that hands SLURM's USR1 on to the training processes it
    started: torchrun would die of it, and take them down before they save."""
    return (
        f"{launcher} & launcher=$!; "
        "trap 'interrupted=1; pkill -USR1 -P $launcher' USR1; "
        "while :; do interrupted=0; wait $launcher; status=$?; "
        '[ "$interrupted" -eq 0 ] && break; done; exit $status'
    )


def sbatch_script(spec: ChainSpec, config: RunConfig) -> str:
    seconds = _sbatch_seconds(spec.time)
    run_dir = Path(config.run.directory).resolve()
    margin = min(spec.signal_margin_s, max(10, seconds // 20))  # a short job trains, too
    lines = [
        "#!/usr/bin/env bash",
        f"#SBATCH --job-name={job_name(config)}",
        f"#SBATCH --time={_slurm_time(seconds)}",
        f"#SBATCH --nodes={spec.nodes}",
        "#SBATCH --ntasks-per-node=1",
        f"#SBATCH --signal=B:USR1@{margin}",
        f"#SBATCH --output={run_dir}/slurm-%j.out",
        "#SBATCH --open-mode=append",
    ]
    if spec.gpus_per_node:
        lines.append(f"#SBATCH --gpus-per-node={spec.gpus_per_node}")
    if spec.partition:
        lines.append(f"#SBATCH --partition={spec.partition}")
    if spec.account:
        lines.append(f"#SBATCH --account={spec.account}")
    env = DEFAULT_ENV | config.run.env | spec.env
    lines += [
        "set -u",
        f"RUN_DIR={shlex.quote(str(run_dir))}",
        'mkdir -p "$RUN_DIR"',
        "# the trainer stops before this time on any SLURM version",
        f'export SLURM_JOB_END_TIME="${{SLURM_JOB_END_TIME:-$(( $(date +%s) + {seconds} ))}}"',
        *(f"export {key}={shlex.quote(value)}" for key, value in sorted(env.items())),
        'first_node="$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)"',
        "# the node's address as SLURM knows it (its name where that is all there is)",
        'MASTER_ADDR="$(scontrol show node "$first_node" | grep -o "NodeAddr=[^ ]*" | cut -d= -f2)"',
        'export MASTER_ADDR="${MASTER_ADDR:-$first_node}"',
        "export MASTER_PORT=$(( 20000 + SLURM_JOB_ID % 20000 ))  # not the previous job's",
        'if [ -f "$RUN_DIR/finished" ]; then',
        '  echo "training already finished: cancelling the rest of the chain"',
        f"  scancel --name={job_name(config)} --state=PENDING",
        "  exit 0",
        "fi",
        f"PYTHON={shlex.quote(spec.python)}",
        f"first_step=$({LATEST_STEP})",
        f"{train_command(spec, run_dir)} &",
        "trainer=$!",
        "# SLURM signals this shell (B:USR1): pass it on, then wait again for the real exit code",
        "trap 'interrupted=1; kill -USR1 $trainer 2>/dev/null' USR1",
        "while :; do",
        "  interrupted=0",
        "  wait $trainer; status=$?",
        '  [ "$interrupted" -eq 0 ] && break',
        "done",
        f"last_step=$({LATEST_STEP})",
        '[ -f "$RUN_DIR/finished" ] && last_step=$(cat "$RUN_DIR/finished")',
        'echo "{\\"job\\": \\"$SLURM_JOB_ID\\", \\"first_step\\": $first_step, '
        '\\"last_step\\": $last_step, \\"exit\\": $status}" >> "$RUN_DIR/' + JOBS_FILE + '"',
        'if [ -f "$RUN_DIR/finished" ]; then',
        '  echo "training finished: cancelling the rest of the chain"',
        f"  scancel --name={job_name(config)} --state=PENDING",
        "  exit 0",
        "fi",
        f"# {EXIT_RESUME}: stopped before the time limit after saving; the next job resumes",
        f'[ "$status" -eq {EXIT_RESUME} ] && exit 0',
        "exit $status",
    ]
    return "\n".join(lines) + "\n"


def submit_script(spec: ChainSpec, script: Path) -> str:
    return (
        "\n".join(
            [
                "#!/usr/bin/env bash",
                "# queue the chain: each job starts after the previous one ends, however it ends",
                "set -euo pipefail",
                f"previous=$(sbatch --parsable {shlex.quote(str(script.resolve()))})",
                'echo "$previous"',
                f"for _ in $(seq 2 {spec.jobs}); do",
                f'  previous=$(sbatch --parsable --dependency=afterany:"$previous" {shlex.quote(str(script.resolve()))})',
                '  echo "$previous"',
                "done",
            ]
        )
        + "\n"
    )


def write_chain(spec: ChainSpec, config: RunConfig, out_dir: Path) -> tuple[Path, Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    # SLURM opens the job's output file there before the script runs
    Path(config.run.directory).mkdir(parents=True, exist_ok=True)
    script = out_dir / SCRIPT
    script.write_text(sbatch_script(spec, config))
    submit = out_dir / SUBMIT
    submit.write_text(submit_script(spec, script))
    for file in (script, submit):
        file.chmod(0o755)
    return script, submit
