"""`sshadapter demo`, the README's first command: no root, no sshd, no configuration needed."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from itertools import pairwise
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def test_demo_shows_accepted_and_rejected_results_and_cleans_up() -> None:
    """The demo shows envelopes, a refused stolen key, counters and an MCP session, then cleans up.

    Envelopes for real and scripted calls, a stolen key refused by the dispatcher next to an
    allowed command, the counters, an MCP session listing every shipped tool; nothing is left
    behind.
    """
    before = set(Path(tempfile.gettempdir()).glob("sshadapter-demo-*"))
    done = subprocess.run(
        [sys.executable, "-m", "sshadapter.cli", "demo"],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    envelopes = {}
    lines = done.stdout.splitlines()
    for command, response in pairwise(lines):
        if command.startswith("$ sshadapter call "):
            envelopes[command.removeprefix("$ sshadapter call ")] = json.loads(response)
    assert envelopes["load_average "]["outcome"] == "success"
    assert envelopes["disk_usage path=/"]["data"]["mounted_on"] == "/"
    assert envelopes["job_run_status project_id=bluebird"]["outcome"] == "success"
    assert "log_tail" not in envelopes["job_run_status project_id=bluebird"]["data"]
    banner = envelopes["deploy_status environment=staging"]
    assert banner["error"] == {"code": "INVALID_RESPONSE", "retryable": False}
    assert "production" not in json.dumps(banner)  # the banner's instruction never gets out
    assert envelopes["run_shell command=id"]["tool"] == "sshadapter"
    assert (
        'sshadapter_rejections_total{reason="schema_mismatch",stage="schema",'
        'tool="deploy_status"} 1.0'
    ) in done.stdout
    # A stolen key on `local` (behind sshadapter-dispatch): refused and logged; the daemon's
    # own command runs.
    refused = lines.index("$ ssh local 'cat /proc/loadavg; id'")
    assert lines[refused + 1].startswith("sshadapter-dispatch: refused (not_canonical) sha256:")
    assert lines[refused + 2] == "exit status 77"
    assert "refused reason=not_canonical" in lines[refused + 3]
    allowed = lines.index("$ ssh local 'cat /proc/loadavg'")
    assert lines[allowed + 1].count(" ") == 4 and lines[allowed + 2] == "exit status 0"
    assert "allowed operation=load_average" in lines[allowed + 3]
    assert 'sshadapter_dispatch_policy_checks_total{host="local",result="current"}' in done.stdout
    # The MCP session: requests as a host writes them, what it gets back.
    requests = [json.loads(line[2:]) for line in lines if line.startswith("> ")]
    assert [r["method"] for r in requests] == [
        "initialize",
        "tools/list",
        "tools/call",
        "tools/call",
    ]
    answers = [line[2:] for line in lines if line.startswith("< ")]
    shipped = sorted(path.stem for path in (ROOT / "commands").glob("*.toml"))
    listed = f"{len(shipped)} tools, each with its input and output schema: "
    assert answers[1].startswith(listed), answers[1]
    names = answers[1].removeprefix(listed).replace(" (read-only)", "").split(", ")
    assert sorted(names) == shipped  # every shipped operation, whatever their number
    success, failure = (json.loads(a.split(": ", 1)[1]) for a in answers[2:])
    assert answers[2].startswith("isError false") and success["outcome"] == "success"
    assert answers[3].startswith("isError true")
    assert failure["error"] == {"code": "INVALID_RESPONSE", "retryable": False}
    assert set(Path(tempfile.gettempdir()).glob("sshadapter-demo-*")) == before


def test_the_demo_without_the_examples_says_so_in_one_line(tmp_path: Path) -> None:
    """Installed without the checkout's commands/ and schemas/, the demo says where it looked."""
    shutil.copytree(ROOT / "sshadapter", tmp_path / "pkg" / "sshadapter")
    code = "import sys; from sshadapter.cli import main; sys.exit(main(['demo']))"
    done = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**os.environ, "PYTHONPATH": str(tmp_path / "pkg")},
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr
    assert done.stderr.startswith("sshadapter demo: no commands/ and schemas/ in ")
    assert len(done.stderr.strip().splitlines()) == 1
