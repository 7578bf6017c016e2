"""ovl._autoinstall: the directory to put on PYTHONPATH, with
OVL_TORCH_INSTALL=1, so that a program one cannot edit runs PyTorch's
symm_mem ops through ovld (its sitecustomize.py; python/README.md)."""
