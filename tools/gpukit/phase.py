"""One run of the GPU check under a time budget, its log timestamped, its whole process family stopped at the end.

`qrewrite rl` starts verl's main_ppo, which starts Ray, whose workers start vLLM engines: a family of processes
that outlives its root when the root is killed. Each process of the family inherits the environment variable
MARK=<name>-<pid>, so the run is stopped by that mark (SIGKILL to every process holding it), not by a process
group that Ray leaves, and a second run on the same machine (the check runs PPO and GRPO side by side) is left
alone. `--kill-after-step N` stops the run once verl has written a complete global_step_N (the check's resume
test: the rerun must continue from there).

  python -m tools.gpukit.phase --name ppo_a --log L --status S.json --budget 240 \\
      [--kill-after-step 2 --run-dir R [--critic]] -- python3 -m qrewrite rl ...
"""

from __future__ import annotations

import argparse
import collections
import os
import re
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

from qrewrite.io_utils import write_json
from qrewrite.training.resume import last_complete_verl_step

MARK = "QRW_GPU_PHASE"
ANSI = re.compile(r"\x1b\[[0-9;]*m")


def family(mark: str) -> list:
    """Every process whose environment holds MARK=mark (psutil; the device image and the verl env have it)."""
    import psutil

    found = []
    for p in psutil.process_iter():
        try:
            if p.pid != os.getpid() and p.environ().get(MARK) == mark:
                found.append(p)
        except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
            continue
    return found


def stop_family(mark: str, root_pid: int | None = None) -> int:
    """SIGKILL the family (twice: a process forked during the first pass is caught by the second)."""
    import psutil

    killed = 0
    for _ in range(2):
        procs = family(mark)
        if root_pid is not None:
            try:
                os.killpg(root_pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass
        for p in procs:
            try:
                p.kill()
                killed += 1
            except psutil.NoSuchProcess:
                pass
        psutil.wait_procs(procs, timeout=20)
    return killed


def run_phase(name: str, cmd: list[str], *, log: Path, budget: float, kill_after_step: int | None = None,
              run_dir: Path | None = None, critic: bool = False, poll_s: float = 1.0) -> dict:
    mark = f"{name}-{os.getpid()}"
    log.parent.mkdir(parents=True, exist_ok=True)
    started = time.time()
    tail: collections.deque[str] = collections.deque(maxlen=80)
    proc = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            env={**os.environ, MARK: mark, "PYTHONUNBUFFERED": "1"})

    def pump() -> None:
        with open(log, "w", encoding="utf-8") as out:
            for raw in iter(proc.stdout.readline, b""):
                line = ANSI.sub("", raw.decode("utf-8", "replace")).rstrip("\n")
                tail.append(line)
                out.write(f"[{time.time() - started:7.1f}] {line}\n")
                out.flush()

    reader = threading.Thread(target=pump, daemon=True)
    reader.start()
    killed, step_at_kill = None, None
    while proc.poll() is None:
        time.sleep(poll_s)
        if kill_after_step is not None and run_dir is not None:
            step = last_complete_verl_step(run_dir, critic=critic)
            if step is not None and step >= kill_after_step:
                killed, step_at_kill = f"after complete global_step_{step}", step
                break
        if time.time() - started > budget:
            killed = f"budget of {budget:.0f} s"
            break
    n = stop_family(mark, proc.pid)  # also after a normal end: a crashed driver leaves Ray and vLLM behind
    rc = proc.wait()
    reader.join(timeout=10)
    return {"name": name, "cmd": cmd, "rc": None if killed else rc,  # psutil reaped a killed root
            "wall_s": round(time.time() - started, 1), "killed": killed,
            "step_at_kill": step_at_kill, "left_behind_killed": n if not killed else None,
            "started": started, "log": str(log), "tail": list(tail)[-40:]}


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv == ["--stop-all"]:  # every run's family a previous check left on this machine
        import psutil

        marks = set()
        for p in psutil.process_iter():
            try:
                if MARK in p.environ():
                    marks.add(p.environ()[MARK])
            except (psutil.NoSuchProcess, psutil.AccessDenied, psutil.ZombieProcess):
                continue
        for m in marks:
            print(f"stopped {stop_family(m)} processes of {m}", flush=True)
        return 0
    if "--" not in argv:
        print("usage: ... -- COMMAND", file=sys.stderr)
        return 2
    cut = argv.index("--")
    ap = argparse.ArgumentParser(prog="python -m tools.gpukit.phase", description=__doc__.split("\n")[0])
    ap.add_argument("--name", required=True)
    ap.add_argument("--log", required=True)
    ap.add_argument("--status", required=True, help="json written at the end")
    ap.add_argument("--budget", type=float, required=True, help="seconds; the run is stopped after them")
    ap.add_argument("--kill-after-step", type=int)
    ap.add_argument("--run-dir")
    ap.add_argument("--critic", action="store_true", help="PPO: a complete step also holds critic/")
    args = ap.parse_args(argv[:cut])
    res = run_phase(args.name, argv[cut + 1:], log=Path(args.log), budget=args.budget,
                    kill_after_step=args.kill_after_step, run_dir=Path(args.run_dir) if args.run_dir else None,
                    critic=args.critic)
    write_json(args.status, res)
    print(f"[phase {args.name}] rc {res['rc']} after {res['wall_s']} s" + (f", stopped {res['killed']}" if res["killed"] else ""),
          flush=True)
    ok = res["rc"] == 0 or (res["step_at_kill"] is not None)
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
