"""TEST HELPER: a real single-node Slurm on loopback, started by hand and stopped by PID.

munge → MariaDB → slurmdbd → slurmctld → slurmd from Debian's packages (slurm-wlm 22.05), no systemd
and no cgroups (proctrack/linuxproc, task/none). The node has one fake GPU (gres.conf `File=/dev/null`,
type h100) and three partitions: `debug` (the default) and `qcpu`/`qgpu`, so a job that lands in
qcpu/qgpu proves the profile's partition settings reached sbatch. Accounting goes to a fresh MariaDB
database per run (dropped at the end), which is what the executor plugin's default `sacct` status
checks read. Daemons run as root in the foreground (children of this process: their PIDs are known,
no PID files), on free ports; configs go to /etc/slurm because the jobstep executor clears SLURM_CONF
from the job environment (only files carrying MARKER are ever overwritten or removed).

Adapted from the configs verified on the dev machine (Debian 12): /work/shared/reference/slurm.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
import uuid
from pathlib import Path

from qrewrite.procs import free_port

ETC = Path("/etc/slurm")
MARKER = "# written by qrewrite tests/slurm/cluster.py (throwaway test cluster)"
APT_PACKAGES = [line.strip() for line in (Path(__file__).parent / "apt.txt").read_text().splitlines()
                if line.strip() and not line.startswith("#")]  # also `make slurm-tools`
BINARIES = ["slurmctld", "slurmd", "slurmdbd", "sbatch", "srun", "sacct", "sacctmgr", "squeue", "scontrol",
            "sinfo", "munged", "munge", "unmunge", "mariadbd", "mariadb"]
NODE_MEM_MB = 1_100_000  # declared (SlurmdParameters=config_overrides): fits the profile's GPU jobs; not enforced
UNREACHABLE = ("Temporary failure resolving", "Could not resolve", "Failed to fetch", "Unable to connect",
               "Network is unreachable", "Connection timed out")
CPU_PARTITION, GPU_PARTITION, ACCOUNT, GPU_TYPE = "qcpu", "qgpu", "lab", "h100"


class AptUnreachable(RuntimeError):
    """apt cannot reach its package servers: the one reason the Slurm test may be skipped."""


def missing_binaries() -> list[str]:
    return [b for b in BINARIES if shutil.which(b) is None and not Path("/usr/sbin", b).exists()]


def apt_install(log: Path) -> float:
    """Install Slurm, munge and MariaDB with apt (root only); returns seconds taken."""
    if os.geteuid() != 0:
        raise RuntimeError(f"the Slurm test needs {missing_binaries()} and installing them needs root")
    start = time.time()
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    with open(log, "a") as fh:
        upd = subprocess.run(["apt-get", "update"], stdout=fh, stderr=subprocess.STDOUT, env=env)
        inst = subprocess.run(["apt-get", "install", "-y", "-q", "--no-install-recommends", *APT_PACKAGES],
                              stdout=fh, stderr=subprocess.STDOUT, env=env)
    text = log.read_text(errors="replace")
    if inst.returncode != 0:
        if upd.returncode != 0 or any(m in text for m in UNREACHABLE):
            raise AptUnreachable(f"apt could not reach its package servers (see {log}):\n{text[-1500:]}")
        raise RuntimeError(f"apt-get install {' '.join(APT_PACKAGES)} failed:\n{text[-3000:]}")
    return time.time() - start


def _run(*cmd: str, check: bool = True, timeout: float = 60) -> subprocess.CompletedProcess:
    proc = subprocess.run(list(cmd), capture_output=True, text=True, timeout=timeout)
    if check and proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} failed ({proc.returncode}): {proc.stdout[-1500:]} {proc.stderr[-1500:]}")
    return proc


def _wait(what: str, ok, timeout: float, logs: list[Path] = ()) -> None:
    deadline = time.time() + timeout
    while time.time() < deadline:
        if ok():
            return
        time.sleep(0.5)
    tails = "\n".join(f"--- {p}:\n{p.read_text(errors='replace')[-2000:]}" for p in logs if p.exists())
    raise RuntimeError(f"{what} not ready after {timeout}s\n{tails}")


class LocalSlurm:
    def __init__(self, state: Path):
        self.state = state
        self.node = socket.gethostname().split(".")[0]
        self.cpus = os.cpu_count() or 1
        self.db = f"qrewrite_slurm_{uuid.uuid4().hex[:8]}"
        self.procs: dict[str, subprocess.Popen] = {}  # daemons this helper started, by name
        self.started_munged: int | None = None
        self.ports = {"ctld": free_port(), "slurmd": free_port(), "dbd": free_port()}
        self.written: list[Path] = []

    # --- configuration -------------------------------------------------------------------------------
    def _conf(self) -> dict[str, str]:
        s, n = self.state, self.node
        slurm = f"""{MARKER}
ClusterName=qrtest
SlurmctldHost={n}(127.0.0.1)
SlurmUser=root
SlurmdUser=root
AuthType=auth/munge
CredType=cred/munge
SlurmctldPort={self.ports['ctld']}
SlurmdPort={self.ports['slurmd']}
StateSaveLocation={s}/ctld
SlurmdSpoolDir={s}/slurmd
SlurmctldPidFile={s}/slurmctld.pid
SlurmdPidFile={s}/slurmd.pid
SlurmctldLogFile={s}/slurmctld.log
SlurmdLogFile={s}/slurmd.log
SlurmctldDebug=info
SlurmdDebug=info
# no cgroups: plain process tracking, no CPU binding
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core_Memory
SchedulerType=sched/backfill
MpiDefault=none
ReturnToService=2
# the node declares more memory than the test machine may have; nothing enforces it without cgroups
SlurmdParameters=config_overrides
# finished jobs stay visible to squeue for 10 min (the executor's squeue fallback)
MinJobAge=600
AccountingStorageType=accounting_storage/slurmdbd
AccountingStorageHost=localhost
AccountingStoragePort={self.ports['dbd']}
AccountingStorageTRES=gres/gpu,gres/gpu:{GPU_TYPE}
# keep the executor's `--comment rule_<name>...` in sacct: it maps Slurm jobs to rules
AccountingStoreFlags=job_comment
JobCompType=jobcomp/filetxt
JobCompLoc={s}/jobcomp.log
GresTypes=gpu
NodeName={n} NodeAddr=127.0.0.1 CPUs={self.cpus} Boards=1 SocketsPerBoard=1 CoresPerSocket={self.cpus} ThreadsPerCore=1 RealMemory={NODE_MEM_MB} Gres=gpu:{GPU_TYPE}:1 State=UNKNOWN
PartitionName=debug Nodes={n} Default=YES MaxTime=INFINITE State=UP
PartitionName={CPU_PARTITION} Nodes={n} Default=NO MaxTime=INFINITE State=UP
PartitionName={GPU_PARTITION} Nodes={n} Default=NO MaxTime=INFINITE State=UP
"""
        gres = f"{MARKER}\n# a fake GPU: a device file that always exists (a count-only line drains the node)\n" \
               f"NodeName={n} Name=gpu Type={GPU_TYPE} File=/dev/null\n"
        # root through MariaDB's unix_socket auth on localhost: no database password anywhere
        dbd = f"""{MARKER}
AuthType=auth/munge
DbdHost=localhost
DbdPort={self.ports['dbd']}
SlurmUser=root
LogFile={s}/slurmdbd.log
PidFile={s}/slurmdbd.pid
StorageType=accounting_storage/mysql
StorageHost=localhost
StorageUser=root
StorageLoc={self.db}
"""
        return {"slurm.conf": slurm, "gres.conf": gres, "slurmdbd.conf": dbd}

    def _write_etc(self) -> None:
        ETC.mkdir(parents=True, exist_ok=True)
        for name, text in self._conf().items():
            path = ETC / name
            if path.exists() and MARKER not in path.read_text(errors="replace"):
                raise RuntimeError(f"{path} exists and was not written by this test: refusing to overwrite a "
                                   "real Slurm configuration (run the test on a machine without one)")
            path.write_text(text)
            path.chmod(0o600 if name == "slurmdbd.conf" else 0o644)
            self.written.append(path)

    # --- daemons -------------------------------------------------------------------------------------
    def _spawn(self, name: str, *cmd: str) -> None:
        log = open(self.state / f"{name}.out", "w")
        self.procs[name] = subprocess.Popen(list(cmd), stdout=log, stderr=subprocess.STDOUT, start_new_session=True)

    def _alive(self, name: str) -> bool:
        p = self.procs.get(name)
        if p is not None and p.poll() is not None:
            out = (self.state / f"{name}.out").read_text(errors="replace")[-2000:]
            raise RuntimeError(f"{name} exited with {p.returncode}:\n{out}")
        return True

    @staticmethod
    def _ok(*cmd: str) -> bool:
        return subprocess.run(list(cmd), capture_output=True, timeout=30).returncode == 0

    def _munge(self) -> None:
        if subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0:
            return  # a running munged (the machine's own): use it, leave it running
        for d in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
            Path(d).mkdir(parents=True, exist_ok=True)
            shutil.chown(d, "munge", "munge")
        _run("runuser", "-u", "munge", "--", "/usr/sbin/munged")
        self.started_munged = int(Path("/run/munge/munged.pid").read_text().strip())
        _wait("munge", lambda: subprocess.run("munge -n | unmunge", shell=True, capture_output=True).returncode == 0, 15)

    def _mariadb(self) -> None:
        if self._ok("mariadb", "-e", "select 1"):
            return  # the machine's MariaDB is running: use it (our database is dropped at the end)
        Path("/run/mysqld").mkdir(parents=True, exist_ok=True)
        shutil.chown("/run/mysqld", "mysql", "mysql")
        self._spawn("mariadbd", "/usr/sbin/mariadbd", "--user=mysql", "--pid-file=/run/mysqld/qrewrite-test.pid")
        _wait("MariaDB", lambda: self._alive("mariadbd") and self._ok("mariadb", "-e", "select 1"), 60,
              [self.state / "mariadbd.out"])

    def start(self) -> None:
        self.state.mkdir(parents=True, exist_ok=True)
        for d in ("ctld", "slurmd"):
            (self.state / d).mkdir(exist_ok=True)
        self._write_etc()
        self._munge()
        self._mariadb()
        self._spawn("slurmdbd", "/usr/sbin/slurmdbd", "-D")
        _wait("slurmdbd", lambda: self._alive("slurmdbd") and self._ok("sacctmgr", "-n", "list", "cluster"), 60,
              [self.state / "slurmdbd.log", self.state / "slurmdbd.out"])
        _run("sacctmgr", "-i", "add", "cluster", "qrtest")
        self._spawn("slurmctld", "/usr/sbin/slurmctld", "-D", "-i")
        _wait("slurmctld", lambda: self._alive("slurmctld") and self._ok("scontrol", "ping"), 60,
              [self.state / "slurmctld.log", self.state / "slurmctld.out"])
        self._spawn("slurmd", "/usr/sbin/slurmd", "-D", "-N", self.node)
        _run("sacctmgr", "-i", "add", "account", ACCOUNT, "Description=qrewrite-test", "Organization=qrewrite")
        _run("sacctmgr", "-i", "add", "user", "root", f"Account={ACCOUNT}", f"DefaultAccount={ACCOUNT}")

        def idle() -> bool:
            self._alive("slurmd")
            state = _run("sinfo", "-h", "-N", "-n", self.node, "-o", "%T", check=False).stdout.strip()
            if "drain" in state or "down" in state:
                _run("scontrol", "update", f"nodename={self.node}", "state=resume", check=False)
            return state.startswith("idle")

        _wait("the node (sinfo: idle)", idle, 60, [self.state / "slurmd.log", self.state / "slurmctld.log"])

    def stop(self) -> None:
        """Cancel leftover jobs, stop the daemons this helper started (by PID), drop the database."""
        if "slurmctld" in self.procs:
            subprocess.run(["scancel", "--full", "--user", "root"], capture_output=True, timeout=30)
        for name in ("slurmd", "slurmctld", "slurmdbd"):
            self._terminate(name)
        if self._ok("mariadb", "-e", "select 1"):
            subprocess.run(["mariadb", "-e", f"DROP DATABASE IF EXISTS {self.db}"], capture_output=True, timeout=30)
        self._terminate("mariadbd")
        if self.started_munged:
            try:
                os.kill(self.started_munged, 15)
            except ProcessLookupError:
                pass
        for path in self.written:
            if path.exists() and MARKER in path.read_text(errors="replace"):
                path.unlink()

    def _terminate(self, name: str) -> None:
        p = self.procs.pop(name, None)
        if p is None or p.poll() is not None:
            return
        p.terminate()
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()

    # --- queries -------------------------------------------------------------------------------------
    def sacct(self, name: str) -> list[dict]:
        """Allocations (not steps) of the jobs named `name` (the executor names every job by its run id)."""
        fields = ["JobID", "JobName", "State", "ExitCode", "Partition", "Account", "AllocCPUS", "ReqMem",
                  "AllocTRES", "Comment"]
        out = _run("sacct", "-X", "-n", "-P", "--name", name, "-S", "now-1days", "-o", ",".join(fields)).stdout
        return [dict(zip(fields, line.split("|"))) for line in out.splitlines() if line.strip()]
