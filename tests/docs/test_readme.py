"""The README's test command is the one CI runs."""

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_ci_runs_the_readme_test_command():
    ci = (ROOT / ".ci" / "run").read_text()
    cmd = next(line.split("=", 1)[1].strip().strip("'") for line in ci.splitlines() if line.startswith("TEST_CMD="))
    readme = (ROOT / "README.md").read_text()
    blocks = readme.split("```bash\n")
    assert blocks[2].split("\n")[0] == cmd, "README command 2 and .ci/run's TEST_CMD differ"
    assert "eagle2-local chat" in blocks[1].split("\n")[0]
