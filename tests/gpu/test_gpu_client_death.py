"""A client that dies with ops in flight on the CUDA backend: ovl-demo runs a
long job on 2 GPUs; one rank process is killed (SIGKILL) mid-way, so its
stream never says `ready` for the ops it had submitted. ovld must let those
ops run out (it releases the departed rank's waits), end the job, free what
it held, keep serving: a fresh job right after passes its checks, and SIGTERM
still stops ovld at once. Without 2 GPUs (ovld cannot start the CUDA
backend) prints "SKIP: ..." and exits 77. The scenario is
ovltest.client_killed_mid_job, which test_client_death runs on the host
backend."""
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))

from ovltest import Daemon, client_killed_mid_job, run_tests, status_json  # noqa: E402

SKIP_CODE = 77


def start_daemon():
    try:
        d = Daemon(backend="cuda")
    except AssertionError as e:
        if "cannot start the cuda backend" in str(e):
            print("SKIP: ovld cannot start the CUDA backend here")
            sys.exit(SKIP_CODE)
        raise
    return d


def test_client_killed_mid_job():
    d = start_daemon()
    try:
        s = status_json(d)
        if s["backend"] != "cuda" or len(s["devices"]) < 2:
            d.stop()
            print("SKIP: needs 2 GPUs on the CUDA backend")
            sys.exit(SKIP_CODE)
        client_killed_mid_job(d, ["-m", "2048", "-n", "4096", "-k", "4096"],
                              ["-m", "256", "-n", "384", "-k", "512"])
    finally:
        d.cleanup()


if __name__ == "__main__":
    run_tests([test_client_killed_mid_job])
