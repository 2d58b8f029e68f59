"""The command that installs what an optional part of pqcache needs, as an
ImportError states it: plain pip where pip may install, and a venv where the
interpreter is managed by the system (PEP 668: Debian's python3 refuses
`pip install` with "externally-managed-environment")."""
import os
import sys
import sysconfig
from typing import Sequence


def externally_managed() -> bool:
    """Whether pip may not install into this interpreter: not a venv, and its
    standard library carries the EXTERNALLY-MANAGED marker of PEP 668."""
    if sys.prefix != sys.base_prefix:
        return False
    return os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))


def install_command(requirements: Sequence[str]) -> str:
    pip = "pip install " + " ".join(requirements)
    if not externally_managed():
        return pip
    # --system-site-packages: the venv still sees a python3-pqcache that apt
    # installed into dist-packages.
    return (f"{sys.executable} is managed by the system (PEP 668: pip will not install into it), "
            f"so in a venv: python3 -m venv --system-site-packages ~/pqcache-venv && "
            f"~/pqcache-venv/bin/{pip}, then run ~/pqcache-venv/bin/python")
