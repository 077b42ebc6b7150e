"""Print a command of README.md's "On a fresh machine" section, so CI runs it as written.

Usage: python .ci/readme_commands.py install|test

``install`` is the first ``bash`` block of that section (install + ``osprey demo --quick``),
``test`` the second (after "Run the tests"); both must be exactly one line. Later blocks (the
interop environment) are not these two. Standard library only: CI calls this before anything is
installed.
"""

from __future__ import annotations

import re
import sys
from pathlib import Path

README = Path(__file__).resolve().parents[1] / "README.md"
SECTION = "## On a fresh machine"


def readme_commands(text: str) -> dict[str, str]:
    """{"install": ..., "test": ...} from the README text; ValueError when the layout changed."""
    start = text.find(SECTION)
    if start < 0:
        raise ValueError(f"README.md has no {SECTION!r} section")
    end = text.find("\n## ", start + len(SECTION))
    section = text[start: end if end >= 0 else len(text)]
    blocks = re.findall(r"```bash\n(.*?)```", section, flags=re.S)
    if len(blocks) < 2:
        raise ValueError(f"{SECTION!r} must start with two bash blocks (install, test); found {len(blocks)}")
    commands = {}
    for name, block in zip(("install", "test"), blocks[:2]):
        lines = [line for line in block.strip().splitlines() if line.strip()]
        if len(lines) != 1:
            raise ValueError(f"the README's {name} command must be one line, got {len(lines)}")
        commands[name] = lines[0].strip()
    return commands


if __name__ == "__main__":
    if len(sys.argv) != 2 or sys.argv[1] not in ("install", "test"):
        sys.exit("usage: readme_commands.py install|test")
    print(readme_commands(README.read_text(encoding="utf-8"))[sys.argv[1]])
