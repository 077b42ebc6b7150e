"""Virtual environments for tests that need a second interpreter with our dependencies.

A symlink to ``sys.executable`` is not such an interpreter: run through a link outside a venv
(no ``pyvenv.cfg`` beside it), Python starts as the *base* interpreter, whose packages are
whatever the machine happens to have (on CI: no torch). A real venv whose ``.pth`` file names
this environment's site-packages has exactly our packages, whatever the base interpreter holds.
"""

from __future__ import annotations

import site
import subprocess
import sysconfig
import venv
from pathlib import Path

__all__ = ["venv_over_ours", "our_site_dirs"]


def our_site_dirs() -> list[str]:
    """This interpreter's site-packages folders (purelib and platlib), each once."""
    found = []
    for path in [*site.getsitepackages(), sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]]:
        if path not in found and Path(path).is_dir():
            found.append(path)
    return found


def venv_over_ours(path: Path, *, with_pip: bool = False) -> Path:
    """A fresh venv at ``path`` that imports this environment's packages; returns its bin/python.

    The folders are named as plain ``.pth`` lines, which are not scanned for ``.pth`` files of
    their own: the editable install of the checkout (a finder hooked in by its own ``.pth``) stays
    out, so ``osprey_*`` is importable there only from what is installed into the venv itself.
    """
    venv.EnvBuilder(with_pip=with_pip, symlinks=True).create(path)
    python = path / "bin" / "python"
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=120).stdout.strip()
    Path(purelib, "_outer_dependencies.pth").write_text("\n".join(our_site_dirs()) + "\n", encoding="utf-8")
    return python
