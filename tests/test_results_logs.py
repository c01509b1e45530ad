"""The hand-run measurements in results/logs/ stay readable and traceable.

Each CSV there is listed in the folder's README, every row has as many fields as the header (a command with an
unquoted comma would shift the row), every row names the code it measured and the command, and every file a
chapter's prose names under results/logs/ exists.
"""
from __future__ import annotations

import csv
import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
LOGS = ROOT / "results" / "logs"


def test_each_log_is_listed_and_well_formed():
    readme = (LOGS / "README.md").read_text()
    problems = []
    for path in sorted(LOGS.glob("*.csv")):
        if f"`{path.name}`" not in readme:
            problems.append(f"{path.name}: not listed in results/logs/README.md")
        header, *rows = list(csv.reader(path.open(newline="")))
        if not {"code", "command"} <= set(header):
            problems.append(f"{path.name}: the header {header} lacks `code` or `command`")
            continue
        code, command = header.index("code"), header.index("command")
        for number, row in enumerate(rows, start=2):
            if len(row) != len(header):
                problems.append(f"{path.name} line {number}: {len(row)} fields, the header has {len(header)}")
            elif not re.fullmatch(r"[0-9a-f]{7,40}", row[code]) or not row[command].strip():
                problems.append(f"{path.name} line {number}: no commit in `code` or no `command`")
    assert not problems, "\n".join(problems)


def test_logs_the_chapters_name_exist():
    named = set()
    for path in sorted((ROOT / "book").glob("*.ipynb")):
        for cell in json.loads(path.read_text())["cells"]:
            if cell["cell_type"] == "markdown":
                named |= set(re.findall(r"results/logs/([\w.-]+\.csv)", "".join(cell["source"])))
    assert named, "no chapter names a file under results/logs/"
    missing = sorted(name for name in named if not (LOGS / name).exists())
    assert not missing, f"named by a chapter but not in results/logs/: {missing}"
