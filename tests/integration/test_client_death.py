"""A client killed with ops in flight, on the host backend: the scenario of
tests/gpu/test_gpu_client_death.py (ovltest.client_killed_mid_job) with
shapes the host GEMM runs quickly. One rank's process is killed (SIGKILL)
while the job has more ops queued than ovld issues at once; ovld must fail
them in order within its issue window, end the job, free what it held, keep
answering, serve a fresh job and stop at once."""
from ovltest import Daemon, client_killed_mid_job, run_tests


def test_client_killed_mid_job():
    d = Daemon(backend="host")
    try:
        client_killed_mid_job(d, ["-m", "64", "-n", "96", "-k", "128"],
                              ["-m", "32", "-n", "48", "-k", "40"], ops_before_kill=30)
    finally:
        d.cleanup()


if __name__ == "__main__":
    run_tests([test_client_killed_mid_job])
