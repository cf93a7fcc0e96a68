"""The CLI in this process, and the one-line user error every bad-input test expects."""

from __future__ import annotations

import contextlib
import io

from slabtune import cli

PREFIX = "slabtune: error: "


def run(*argv) -> tuple[int, str, str]:
    """``slabtune ARGV`` in this process: (exit status, stdout, stderr)."""
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        rc = cli.main([str(a) for a in argv])
    return rc, out.getvalue(), err.getvalue()


def error_line(rc: int, err: str, *needles: str) -> str:
    """Assert a user error (exit 2, one stderr line starting 'slabtune: error:', no
    traceback, every needle in the line) and return the line."""
    lines = [ln for ln in err.splitlines() if ln.strip()]
    assert rc == 2, (rc, err)
    assert len(lines) == 1, err
    assert lines[0].startswith(PREFIX), lines[0]
    assert "Traceback" not in err
    for n in needles:
        assert n in lines[0], (n, lines[0])
    return lines[0]
