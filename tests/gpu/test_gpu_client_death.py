"""Deaths mid-job on the CUDA backend, with a job of WORLD ranks (--world,
default 2) that go round-robin over the GPUs (ovl-demo: rank r on GPU r mod
G): on one GPU every rank shares it, on G >= WORLD GPUs each rank has its
own. ctest runs it at world 2 and 4 (test_gpu_client_death_w2, _w4).
Without a GPU (ovld cannot start the CUDA backend, or has no device) prints
"SKIP: ..." and exits 77.

- A client killed (ovltest.client_killed_mid_job): ovl-demo runs a long job;
  its last rank's process (rank WORLD - 1) is killed (SIGKILL) mid-way, so
  its stream never says `ready` for the ops it had submitted. ovld must let
  those ops run out (it releases the departed rank's waits), end the job,
  free what it held, keep serving: a fresh job of WORLD ranks right after
  passes its checks, and SIGTERM still stops ovld at once.
- ovld killed (ovltest.daemon_killed_mid_job): the demo's streams wait on
  ops that will never be done; libovl's watcher must release them, so that
  the demo ends with an error instead of hanging in cudaStreamSynchronize.

tests/integration/test_client_death.py runs both on the host backend."""
import argparse
import os
import sys

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "integration"))

from ovltest import (Daemon, client_killed_mid_job, daemon_killed_mid_job, run_tests,  # noqa: E402
                     share, status_json)

SKIP_CODE = 77
SHAPE = ["-m", "2048", "-n", "4096", "-k", "4096"]
WORLD = 2  # set by main()


def start_daemon():
    try:
        d = Daemon(backend="cuda")
    except AssertionError as e:
        if "cannot start the cuda backend" in str(e):
            print("SKIP: ovld cannot start the CUDA backend here")
            sys.exit(SKIP_CODE)
        raise
    s = status_json(d)
    if s["backend"] != "cuda" or len(s["devices"]) < 1:
        d.stop()
        d.cleanup()
        print("SKIP: no GPU on the CUDA backend")
        sys.exit(SKIP_CODE)
    ngpu = len(s["devices"])
    print("world %d on %d GPU%s: %s" % (WORLD, ngpu, "" if ngpu == 1 else "s",
                                        share(WORLD, ngpu)), flush=True)
    return d


def test_client_killed_mid_job():
    d = start_daemon()
    try:
        client_killed_mid_job(d, SHAPE, ["-m", "256", "-n", "384", "-k", "512"], world=WORLD)
    finally:
        d.cleanup()


def test_daemon_killed_mid_job():
    d = start_daemon()
    try:
        took = daemon_killed_mid_job(d, SHAPE, world=WORLD)
        print("ovl-demo ended %.2f s after ovld was killed" % took)
    finally:
        d.cleanup()


def main():
    global WORLD
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--world", type=int, default=2, help="ranks of the job (2..64)")
    WORLD = ap.parse_args().world
    if not 2 <= WORLD <= 64:
        ap.error("--world must be 2..64")
    run_tests([test_client_killed_mid_job, test_daemon_killed_mid_job])


if __name__ == "__main__":
    main()
