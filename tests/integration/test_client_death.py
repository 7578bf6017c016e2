"""Deaths mid-job on the host backend, the scenarios of the GPU tests
(tests/gpu/test_gpu_client_death.py) with shapes the host GEMM runs quickly:
at world 2 on ovld's default devices, and at world 4 with every rank on one
device (host_devices = 1), as the GPU test runs them on one GPU.

- A client killed (ovltest.client_killed_mid_job): one rank's process is
  killed (SIGKILL) while the job has more ops queued than ovld issues at
  once; ovld must fail them in order within its issue window, end the job,
  free what it held, keep answering, serve a fresh job and stop at once.
- ovld killed (ovltest.daemon_killed_mid_job): the clients must end with an
  error naming ovld instead of waiting for ever."""
from ovltest import Daemon, client_killed_mid_job, daemon_killed_mid_job, run_tests

SHAPE = ["-m", "64", "-n", "96", "-k", "128"]
ONE_DEVICE = "host_devices = 1\n"


def test_client_killed_mid_job():
    d = Daemon(backend="host")
    try:
        client_killed_mid_job(d, SHAPE, ["-m", "32", "-n", "48", "-k", "40"], ops_before_kill=30)
    finally:
        d.cleanup()


def test_daemon_killed_mid_job():
    d = Daemon(backend="host")
    try:
        daemon_killed_mid_job(d, SHAPE, ops_before_kill=30)
    finally:
        d.cleanup()


def test_client_killed_mid_job_w4_one_device():
    d = Daemon(backend="host", config=ONE_DEVICE)
    try:
        client_killed_mid_job(d, SHAPE, ["-m", "32", "-n", "48", "-k", "40"], ops_before_kill=30,
                              world=4)
    finally:
        d.cleanup()


def test_daemon_killed_mid_job_w4_one_device():
    d = Daemon(backend="host", config=ONE_DEVICE)
    try:
        daemon_killed_mid_job(d, SHAPE, ops_before_kill=30, world=4)
    finally:
        d.cleanup()


if __name__ == "__main__":
    run_tests([test_client_killed_mid_job, test_daemon_killed_mid_job,
               test_client_killed_mid_job_w4_one_device, test_daemon_killed_mid_job_w4_one_device])
