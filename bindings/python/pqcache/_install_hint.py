"""The command that installs what an optional part of pqcache needs, as an
ImportError states it: plain pip where pip may install, and a venv where the
interpreter is managed by the system (PEP 668: Debian's python3 refuses
`pip install`, and `pip install --user` too, with
"externally-managed-environment")."""
import importlib.util
import os
import sys
import sysconfig
from typing import Sequence

# The venv the hint makes; in the user's home so that it outlives the shell.
VENV = "~/pqcache-venv"


def externally_managed() -> bool:
    """Whether pip may not install into this interpreter: not a venv, and its
    standard library carries the EXTERNALLY-MANAGED marker of PEP 668."""
    if sys.prefix != sys.base_prefix:
        return False
    return os.path.exists(os.path.join(sysconfig.get_path("stdlib"), "EXTERNALLY-MANAGED"))


def pip() -> str:
    """The pip that may install for this interpreter: pip, or where the
    system manages it, the pip of the venv install_command makes."""
    return f"{VENV}/bin/pip" if externally_managed() else "pip"


def install_command(requirements: Sequence[str]) -> str:
    command = f"{pip()} install " + " ".join(requirements)
    if not externally_managed():
        return command
    # --system-site-packages: the venv still sees a python3-pqcache (and
    # python3-numpy) that apt installed into dist-packages.
    steps = [f"{sys.executable} -m venv --system-site-packages {VENV}", command]
    if importlib.util.find_spec("ensurepip") is None:
        # Debian keeps ensurepip, which venv needs to put pip into the venv,
        # in its own package; without it the venv step fails.
        steps.insert(0, f"sudo apt install python3.{sys.version_info.minor}-venv")
    return (f"{sys.executable} is managed by the system (PEP 668: pip will not install into it, "
            f"not even with --user), so in a venv: {' && '.join(steps)}, then run "
            f"{VENV}/bin/python")
