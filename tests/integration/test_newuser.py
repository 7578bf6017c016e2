"""What a new user trips on (issue 32, section 4), checked where it is
said: the README's paths are the ones scripts/demo and scripts/test build,
the README's two-ovld example runs as it stands and leaves nothing behind,
a GPU test that skips leaves no directory in /tmp, and scripts/test ends
with the tests skipped and why, then 'tests: N passed, N failed, N
skipped' (scripts/test-summary over ctest's JUnit file). The rest of the
section is in the tests of what it changed: test_ovlctl.py
(test_plan_usage_errors: --socket without its value; test_stale_socket_hint;
test_plan_streams_not_used), test_stats.py (the stats table's _ms rows),
test_e2e.py (test_demo_no_daemon), test_daemon.py
(test_detached_leaves_the_terminal, test_cuda_without_driver_says_so)."""
import os
import re
import subprocess
import sys
import tempfile

from ovltest import free_port, run_tests

SRC = os.environ.get("OVL_SOURCE_DIR",
                     os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
BUILD = os.environ.get("OVL_BUILD_DIR", os.path.join(SRC, "build", "test"))
SKIP_CODE = 77


def readme():
    with open(os.path.join(SRC, "README.md")) as f:
        return f.read()


def section(text, title):
    """The text of the README's section `## title`, up to the next one."""
    start = text.index("\n## %s\n" % title)
    end = text.find("\n## ", start + 1)
    return text[start:end if end >= 0 else len(text)]


def script_build_dir(name, var):
    """The build directory scripts/name uses by default (build=${VAR:-$root/DIR})."""
    with open(os.path.join(SRC, "scripts", name)) as f:
        m = re.search(r"^build=\$\{%s:-\$root/([\w/.-]+)\}$" % var, f.read(), re.M)
    assert m, "scripts/%s: no build=${%s:-$root/...} line" % (name, var)
    return m.group(1)


def test_readme_paths_are_the_scripts():
    """Every program path in the README's 'Jobs across nodes' examples is
    under the build directory scripts/demo makes (build/release), and names
    a program the build makes there (checked in this build, which has the
    same layout); the quick start names both scripts' directories."""
    demo_dir = script_build_dir("demo", "OVL_DEMO_BUILD")
    test_dir = script_build_dir("test", "OVL_TEST_BUILD")
    text = readme()
    quick = text[:text.index("\n## ")]
    assert "`%s`" % demo_dir in quick and "`%s`" % test_dir in quick, quick
    paths = re.findall(r"(?<![\w/.])(build/[\w.+-]+)/([\w/.+-]+)", section(text, "Jobs across nodes"))
    assert paths, "no build/... path in 'Jobs across nodes'"
    for top, rest in paths:
        assert top == demo_dir, "README: %s/%s is not under %s, where scripts/demo builds" % (
            top, rest, demo_dir)
        assert os.path.isfile(os.path.join(BUILD, rest)), (
            "README: %s/%s: the build makes no %s" % (top, rest, rest))


def free_base_port():
    """A port p with p + 1 and p + 2 free on 127.0.0.1 (the example's ovld
    listen on port + 1 and port + 2), drawn as ovltest.free_port draws."""
    return free_port(2) - 1


def test_readme_two_node_example_runs():
    """The README's one-machine example of a job across two ovld, run as it
    stands (bash -e), with this build for build/release and free ports:
    both ranks OK, and the directory it made is gone at the end (no key,
    configuration, socket or log left in /tmp)."""
    text = section(readme(), "Jobs across nodes")
    blocks = re.findall(r"```sh\n(.*?)```", text, re.S)
    block = [b for b in blocks if "mktemp -d" in b and "ovl-example-two-nodes" in b]
    assert len(block) == 1, blocks
    script = block[0]
    assert re.search(r"^port=7410 ", script, re.M), script
    script = re.sub(r"^port=7410 ", "port=%d " % free_base_port(), script, flags=re.M)
    script = script.replace("build/release/", BUILD.rstrip("/") + "/")
    with tempfile.TemporaryDirectory(prefix="ovl-test-readme-") as tmp:
        env = dict(os.environ, TMPDIR=tmp)
        p = subprocess.run(["bash", "-e", "-c", script], env=env, capture_output=True, text=True,
                           timeout=240)
        assert p.returncode == 0, (p.returncode, p.stdout, p.stderr)
        for r in (0, 1):
            assert re.search(r"^rank %d: OK" % r, p.stdout, re.M), (p.stdout, p.stderr)
        assert "round trip" in p.stdout, p.stdout
        assert os.listdir(tmp) == [], "the example left %r" % os.listdir(tmp)


def test_skipping_gpu_test_cleans_up():
    """A GPU test that skips (here: no GPU, or no CUDA backend) removes the
    temporary directory of the ovld it tried to start: run with its own
    TMPDIR, that directory is empty afterwards. Where a GPU is, the test
    runs, and must leave nothing either."""
    test = os.path.join(SRC, "tests", "gpu", "test_gpu_client_death.py")
    with tempfile.TemporaryDirectory(prefix="ovl-test-gpu-") as tmp:
        env = dict(os.environ, TMPDIR=tmp)
        p = subprocess.run([sys.executable, test, "--world", "2"], env=env, capture_output=True,
                           text=True, timeout=600)
        assert p.returncode in (0, SKIP_CODE), (p.returncode, p.stdout, p.stderr)
        if p.returncode == SKIP_CODE:
            assert p.stdout.startswith("SKIP: "), p.stdout
        assert os.listdir(tmp) == [], "%s left %r" % (test, os.listdir(tmp))


SUMMARY = os.path.join(SRC, "scripts", "test-summary")

CTEST_PROJECT = """cmake_minimum_required(VERSION 3.16)
project(summary NONE)
enable_testing()
add_test(NAME ok COMMAND true)
add_test(NAME no_widget COMMAND sh -c "echo 'SKIP: no widget here'; exit 77")
set_tests_properties(no_widget PROPERTIES SKIP_RETURN_CODE 77)
add_test(NAME bad COMMAND false)
add_test(NAME ok2 COMMAND true)
add_test(NAME missing COMMAND /nonexistent/ovl-no-such-program)
"""


def test_summary_lines():
    """scripts/test ends with scripts/test-summary over ctest's JUnit file,
    and exits with ctest's status: the skipped tests with why (their SKIP
    line), then 'tests: N passed, N failed, N skipped' alone on the last
    line; an unreadable file counts as a failure. Both scripts say what
    they do before the build's output."""
    with tempfile.TemporaryDirectory(prefix="ovl-test-summary-") as tmp:
        src, bld = os.path.join(tmp, "src"), os.path.join(tmp, "build")
        os.mkdir(src)
        with open(os.path.join(src, "CMakeLists.txt"), "w") as f:
            f.write(CTEST_PROJECT)
        subprocess.run(["cmake", "-S", src, "-B", bld], check=True, capture_output=True,
                       timeout=120)
        junit = os.path.join(tmp, "junit.xml")
        c = subprocess.run(["ctest", "--test-dir", bld, "--output-junit", junit],
                           capture_output=True, text=True, timeout=120)
        assert c.returncode != 0, c.stdout  # 'bad' failed
        p = subprocess.run([SUMMARY, junit], capture_output=True, text=True, timeout=60)
        assert p.returncode == 0 and p.stderr == "", p
        # a test ctest could not run (its program missing) is a failure, as
        # ctest counts it, not a skip
        assert p.stdout == ("Skipped (1):\n"
                            "  no_widget  no widget here\n"
                            "tests: 2 passed, 2 failed, 1 skipped\n"), p.stdout
        p = subprocess.run([SUMMARY, os.path.join(tmp, "none.xml")], capture_output=True,
                           text=True, timeout=60)
        assert p.returncode == 1 and p.stdout == "tests: 0 passed, 1 failed, 0 skipped\n", p
    with open(os.path.join(SRC, "scripts", "test")) as f:
        lines = [ln for ln in f.read().splitlines() if ln.strip() and not ln.startswith("#")]
    assert lines[-1] == 'exit "$rc"', lines[-3:]
    assert lines[-2] == '"$root/scripts/test-summary" "$junit" || rc=1', lines[-3:]
    assert any("--output-junit \"$junit\"" in ln for ln in lines), lines
    for name in ("demo", "test"):
        with open(os.path.join(SRC, "scripts", name)) as f:
            body = f.read()
        said = body.find('echo "scripts/%s: ' % name)
        assert 0 <= said < body.index("install-deps\"") < body.index("cmake --build"), name


if __name__ == "__main__":
    run_tests([test_readme_paths_are_the_scripts, test_readme_two_node_example_runs,
               test_skipping_gpu_test_cleans_up, test_summary_lines])
