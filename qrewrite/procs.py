"""Child servers: a free loopback port, and stopping a server's whole process group. The one copy the deploy check,
the benchmarks and the tests use."""

from __future__ import annotations

import contextlib
import os
import signal
import socket
import subprocess


def free_port(host: str = "127.0.0.1") -> int:
    with socket.socket() as s:
        s.bind((host, 0))
        return s.getsockname()[1]


def stop_process(proc: subprocess.Popen, grace_s: float = 20.0) -> None:
    """SIGTERM the process group of `proc` (started with start_new_session), SIGKILL what is left after `grace_s`;
    reap it. A process started without a group of its own gets the signals alone."""
    own_group = False
    with contextlib.suppress(ProcessLookupError, PermissionError):
        own_group = os.getpgid(proc.pid) == proc.pid
    for sig, wait in ((signal.SIGTERM, grace_s), (signal.SIGKILL, 10.0)):
        try:
            os.killpg(proc.pid, sig) if own_group else proc.send_signal(sig)
        except ProcessLookupError:
            break
        try:
            proc.wait(wait)
            if own_group:  # the leader is gone; its group may not be (workers): one more SIGKILL to the group
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(proc.pid, signal.SIGKILL)
            break
        except subprocess.TimeoutExpired:
            continue
    proc.wait()
