"""`snakemake -n`, plus the exact Apptainer command line of every job.

    python slurm/container_dryrun.py --profile slurm [more snakemake args]

Snakemake's own dry run lists jobs and shell commands but not the container call around them. This runs
that same dry run (same CLI, profile and config) and, for each job, renders the command with Snakemake's
own `singularity.shellcmd` and shell prefix: the code that wraps the command when the job really runs.
Needs `apptainer` (or `singularity`) on PATH, as any `--sdm apptainer` run does.
"""

from __future__ import annotations

import sys

from snakemake.deployment import singularity
from snakemake.executors import dryrun
from snakemake.logging import logger
from snakemake.shell import shell

_printjob = dryrun.Executor.printjob


def container_command(job, workflow) -> str | None:
    """The command the job's shell step would run, as executed under `--sdm apptainer` (None: no container)."""
    if not job.container_img_url or job.shellcmd is None:
        return None
    exe = shell.get_executable()
    cmd = " ".join((shell._get_process_prefix(exe), job.shellcmd, shell._process_suffix)).strip()
    return singularity.shellcmd(job.container_img_path, cmd, bind=workflow.runtime_paths,
                                args=workflow.deployment_settings.apptainer_args, shell_executable=exe,
                                container_workdir=job.shadow_dir)


def _printjob_with_container(self, job) -> None:
    _printjob(self, job)
    for j in (job.jobs if job.is_group() else [job]):
        cmd = container_command(j, self.workflow)
        if cmd is not None:
            logger.info(f"Container command ({j.rule.name}): {cmd}")


def main(argv: list[str]) -> None:
    dryrun.Executor.printjob = _printjob_with_container
    from snakemake.cli import main as snakemake_main

    snakemake_main(["--dry-run", "--software-deployment-method", "apptainer", *argv])


if __name__ == "__main__":
    main(sys.argv[1:])
