"""The README speaks to users: no references to where a figure's target came from, example
commands that use folders the README itself creates, and example outputs git-ignored."""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
README = (ROOT / "README.md").read_text()


def _bash_lines() -> list[str]:
    blocks = re.findall(r"```bash\n(.*?)```", README, flags=re.DOTALL)
    return [line.split("#")[0].strip() for block in blocks for line in block.splitlines()]


def test_no_reference_to_an_issue_or_a_session() -> None:
    text = re.sub(r"[\w-]+/[\w-]+#\d+", "", README)  # upstream references such as owner/repo#1
    assert re.findall(r"(?i)\bissue'?s?\b|\bsession\b", text) == []


def test_example_sources_are_created_by_the_readme() -> None:
    """Every `fastdata preprocess demo-data/...` source is a folder an earlier README line
    makes (make_sample_dataset.py), not one only a benchmark creates."""
    made = set()
    for line in _bash_lines():
        if line.startswith("python tools/make_sample_dataset.py"):
            made.add(line.split()[2])
        elif line.startswith("fastdata preprocess demo-data/"):
            assert line.split()[2] in made, line


def test_example_outputs_are_git_ignored() -> None:
    outputs = {
        word
        for line in _bash_lines()
        for word in line.split()
        if re.fullmatch(r"(out|out-[\w-]+|demo-data)/", word)
    }
    assert {"out/", "out-jpeg/", "out-ray/"} <= outputs
    for folder in sorted(outputs):
        done = subprocess.run(
            ["git", "check-ignore", "-q", f"{folder}index.json"], cwd=ROOT, timeout=30, check=False
        )
        assert done.returncode == 0, f"{folder} is not git-ignored"
