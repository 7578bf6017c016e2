"""Deaths mid-job on the CUDA backend, on 2 GPUs. Without 2 GPUs (ovld
cannot start the CUDA backend) prints "SKIP: ..." and exits 77.

- A client killed (ovltest.client_killed_mid_job): ovl-demo runs a long job;
  one rank process is killed (SIGKILL) mid-way, so its stream never says
  `ready` for the ops it had submitted. ovld must let those ops run out (it
  releases the departed rank's waits), end the job, free what it held, keep
  serving: a fresh job right after passes its checks, and SIGTERM still
  stops ovld at once.
- ovld killed (ovltest.daemon_killed_mid_job): the demo's streams wait on
  ops that will never be done; libovl's watcher must release them, so that
  the demo ends with an error instead of hanging in cudaStreamSynchronize.

tests/integration/test_client_death.py runs both on the host backend."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))

from ovltest import (Daemon, client_killed_mid_job, daemon_killed_mid_job, run_tests,  # noqa: E402
                     status_json)

SKIP_CODE = 77
SHAPE = ["-m", "2048", "-n", "4096", "-k", "4096"]


def start_daemon():
    try:
        d = Daemon(backend="cuda")
    except AssertionError as e:
        if "cannot start the cuda backend" in str(e):
            print("SKIP: ovld cannot start the CUDA backend here")
            sys.exit(SKIP_CODE)
        raise
    s = status_json(d)
    if s["backend"] != "cuda" or len(s["devices"]) < 2:
        d.stop()
        d.cleanup()
        print("SKIP: needs 2 GPUs on the CUDA backend")
        sys.exit(SKIP_CODE)
    return d


def test_client_killed_mid_job():
    d = start_daemon()
    try:
        client_killed_mid_job(d, SHAPE, ["-m", "256", "-n", "384", "-k", "512"])
    finally:
        d.cleanup()


def test_daemon_killed_mid_job():
    d = start_daemon()
    try:
        took = daemon_killed_mid_job(d, SHAPE)
        print("ovl-demo ended %.2f s after ovld was killed" % took)
    finally:
        d.cleanup()


if __name__ == "__main__":
    run_tests([test_client_killed_mid_job, test_daemon_killed_mid_job])
