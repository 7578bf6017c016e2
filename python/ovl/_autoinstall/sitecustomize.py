"""Run at interpreter start where this directory is on PYTHONPATH
(python/README.md, "One line for torch.compile, TorchTitan and vLLM"):
with OVL_TORCH_INSTALL set (not empty, not 0), imports ovl.torch, which
then installs ovl's kernels for PyTorch's symm_mem ops. Any other
sitecustomize later on sys.path (Debian ships one) runs too, first. A
failure here is reported on stderr and never stops the program."""
import importlib.util
import os
import sys


def _chain():
    """Runs the next sitecustomize.py on sys.path after this one's."""
    here = os.path.dirname(os.path.abspath(__file__))
    for d in sys.path:
        if not d or os.path.abspath(d) == here:
            continue
        f = os.path.join(d, "sitecustomize.py")
        if os.path.isfile(f):
            spec = importlib.util.spec_from_file_location("_ovl_next_sitecustomize", f)
            mod = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(mod)
            return


def _install():
    if os.environ.get("OVL_TORCH_INSTALL", "") in ("", "0"):
        return
    try:
        import ovl.torch  # noqa: F401  (installs: OVL_TORCH_INSTALL)
    except Exception as e:
        sys.stderr.write("ovl: OVL_TORCH_INSTALL is set, but ovl.torch did not install: %s\n"
                         % e)


try:
    _chain()
except Exception as _e:
    sys.stderr.write("ovl: the next sitecustomize failed: %s\n" % _e)
_install()
