"""The command lines README.md and docs/ show, and a copy of the project to run them in exactly as written."""

import os
import re
import shlex
import subprocess
from pathlib import Path

from tests.paths import PROJECT_ROOT

DOCUMENTS = [PROJECT_ROOT / "README.md", *sorted((PROJECT_ROOT / "docs").glob("*.md"))]


def documented_commands(prefix: str) -> list[tuple[str, str]]:
    """(document name, command line) of every line of a ```bash block that starts with `prefix`, its trailing
    comment cut off."""
    found = []
    for document in DOCUMENTS:
        for block in re.findall(r"```bash\n(.*?)```", document.read_text(), flags=re.S):
            for line in block.splitlines():
                line = line.strip()
                if line.startswith(prefix):
                    found.append((document.name, strip_comment(line)))
    return found


def strip_comment(line: str) -> str:
    """The command without a trailing `# comment` (shlex keeps quoted '#'s)."""
    lexer = shlex.shlex(line, posix=True, punctuation_chars=False)
    lexer.whitespace_split, lexer.commenters = True, "#"
    return shlex.join(list(lexer))


def project_copy(target: Path) -> Path:
    """The project's tracked and new (not ignored) files copied to `target`, with the project's .venv and the
    JavaScript client's installed packages linked in:
    a documented command then runs there as written, and its outputs stay out of the checkout."""
    listed = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard", "-z"], cwd=PROJECT_ROOT,
                            capture_output=True, text=True, check=True).stdout.split("\0")
    for relative in filter(None, listed):
        source = PROJECT_ROOT / relative
        if source.is_file():
            destination = target / relative
            destination.parent.mkdir(parents=True, exist_ok=True)
            destination.write_bytes(source.read_bytes())
            os.chmod(destination, source.stat().st_mode)
    (target / ".venv").symlink_to(PROJECT_ROOT / ".venv")
    node_modules = PROJECT_ROOT / "clients" / "web" / "node_modules"  # installed by setup.sh, as .venv is
    if node_modules.is_dir():
        (target / "clients" / "web" / "node_modules").symlink_to(node_modules)
    return target
