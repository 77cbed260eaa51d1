#!/usr/bin/env python3
"""Starts N processes of one multi-process JAX program on this machine, as a cluster would.

    python scripts/launch_local.py --processes=2 --cpu_devices=2 -- \\
        python -m fp8jax.experiments.study --distributed --out=out/mh

Each process gets ``JAX_COORDINATOR_ADDRESS`` (127.0.0.1 and a free port),
``JAX_NUM_PROCESSES`` and ``JAX_PROCESS_ID``, which ``--distributed`` passes to
``jax.distributed.initialize()`` (``fp8jax.train.multihost.initialize``). With
``--cpu_devices=K`` the processes run on the CPU with K devices each and gloo collectives;
with ``--gpus_per_process=K`` process i sees GPUs i*K .. i*K+K-1.

A SIGTERM to the launcher reaches every process (a preemption: the run saves at the next
step and exits with 75); Ctrl-C reaches them from the terminal. When a process fails, the
others cannot go on (they wait for it at the next collective): after ``--grace`` seconds
they are killed. The launcher exits with the first non-zero status (128 + N for a process
killed by signal N), else 0.
Standard library only.
"""

from __future__ import annotations

import argparse
import os
import signal
import socket
import subprocess
import sys
import time


def free_port() -> int:
  with socket.socket() as s:
    s.bind(("127.0.0.1", 0))
    return s.getsockname()[1]


def environments(processes: int, cpu_devices: int = 0, gpus_per_process: int = 0,
                 port: int = 0) -> list[dict]:
  """The environment of each process (over a copy of this one's)."""
  port = port or free_port()
  out = []
  for i in range(processes):
    env = {**os.environ, "JAX_COORDINATOR_ADDRESS": f"127.0.0.1:{port}",
           "JAX_NUM_PROCESSES": str(processes), "JAX_PROCESS_ID": str(i)}
    if cpu_devices:
      env.update(JAX_PLATFORMS="cpu", JAX_NUM_CPU_DEVICES=str(cpu_devices),
                 JAX_CPU_COLLECTIVES_IMPLEMENTATION="gloo")
    if gpus_per_process:
      env["JAX_LOCAL_DEVICE_IDS"] = ",".join(
          str(d) for d in range(i * gpus_per_process, (i + 1) * gpus_per_process))
    out.append(env)
  return out


def status(code: int) -> int:
  """A Popen return code as a shell exit status."""
  return 128 - code if code < 0 else code


def run(command: list[str], envs: list[dict], grace: float) -> int:
  procs = [subprocess.Popen(command, env=env) for env in envs]
  for i, p in enumerate(procs):
    print(f"launch_local: process {i}: pid {p.pid}", file=sys.stderr, flush=True)

  def forward(signum, frame):
    del frame
    for p in procs:
      if p.poll() is None:
        p.send_signal(signum)

  signal.signal(signal.SIGTERM, forward)
  signal.signal(signal.SIGINT, signal.SIG_IGN)  # the terminal sends it to every process
  first, deadline = 0, None
  while [p.poll() for p in procs].count(None):  # poll every process: their codes update
    failed = [status(p.returncode) for p in procs if p.returncode not in (None, 0)]
    if failed and deadline is None:
      first, deadline = failed[0], time.monotonic() + grace
    if deadline is not None and time.monotonic() > deadline:
      for p in procs:
        if p.poll() is None:
          p.kill()
    time.sleep(0.1)
  codes = [status(p.returncode) for p in procs]
  return first or next((c for c in codes if c), 0)


def main() -> int:
  parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
  parser.add_argument("--processes", "-n", type=int, default=2)
  devices = parser.add_mutually_exclusive_group()
  devices.add_argument("--cpu_devices", type=int, default=0,
                       help="CPU processes with this many devices each (gloo collectives)")
  devices.add_argument("--gpus_per_process", type=int, default=0,
                       help="GPUs per process (process i sees GPUs i*K .. i*K+K-1)")
  parser.add_argument("--port", type=int, default=0, help="coordinator port (default: free)")
  parser.add_argument("--grace", type=float, default=10.0,
                      help="seconds the others get after a process fails")
  parser.add_argument("command", nargs=argparse.REMAINDER,
                      help="-- then the command every process runs")
  args = parser.parse_args()
  command = args.command[1:] if args.command[:1] == ["--"] else args.command
  if not command or args.processes < 1:
    parser.error("give --processes >= 1 and a command after --")
  envs = environments(args.processes, args.cpu_devices, args.gpus_per_process, args.port)
  return run(command, envs, args.grace)


if __name__ == "__main__":
  sys.exit(main())
