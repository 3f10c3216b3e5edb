"""The course's ``nbgrader collect`` takes a submission only from the student it names:
an exchange with submissions owned by real logins (chowned, as root), collected by
nbgrader's own command with the course's config. The whole path with real accounts, a
student submitting in another's name and ``collect --update``: tests/test_shared_machine.py."""

import os
import pwd
import subprocess
import sys

import pytest

from autograder import paths
from tests.notebooks import class_course, user_environment

CH = "03_self_attention"
# three logins every Linux has; the test makes their files, it never runs as them
A, B, C = "daemon", "bin", "sys"

pytestmark = pytest.mark.skipif(
    os.geteuid() != 0 or any(_ not in {p.pw_name for p in pwd.getpwall()}
                             for _ in (A, B, C)),
    reason="gives files to other logins: needs root, and the users daemon, bin, sys",
)  # fmt: skip


def _submission(inbound, named, owner, when, text, stranger=None):
    """An inbound submission as `nbgrader submit --student NAMED` run by OWNER leaves
    it; ``stranger``: one file in it owned by another login."""
    folder = inbound / f"{named}+{CH}+{when}.000000 UTC+{os.urandom(4).hex()}"
    folder.mkdir()
    (folder / f"{CH}.ipynb").write_text(text)
    (folder / "timestamp.txt").write_text(f"{when}.000000 UTC")
    uid = pwd.getpwnam(owner).pw_uid
    for path in (folder, *folder.iterdir()):
        os.chown(path, uid, uid)
    if stranger:
        os.chown(folder / f"{CH}.ipynb", pwd.getpwnam(stranger).pw_uid, -1)


def _collect(root, exchange, *args):
    return subprocess.run(
        [sys.executable, "-m", "nbgrader", "collect", CH, *args,
         f"--Exchange.root={exchange}"],
        cwd=root, capture_output=True, text=True, timeout=120,
        env=user_environment(PYTHONPATH=str(paths.REPO)),
    )  # fmt: skip


def test_a_submission_counts_only_for_the_login_that_made_it(tmp_path):
    root = class_course(tmp_path / "course", CH, {})
    exchange = tmp_path / "exchange"
    inbound = exchange / "attention-course" / "inbound"
    inbound.mkdir(parents=True)
    _submission(inbound, A, A, "2026-01-14 10:00:00", "A's own")
    _submission(inbound, B, B, "2026-01-14 11:00:00", "B's own")
    first = _collect(root, exchange)
    assert first.returncode == 0, first.stderr[-3000:]
    assert "REFUSED" not in first.stderr
    # B submits in A's name (later than A's own), and in C's, who submitted nothing; a
    # folder of A's own with a file of B's in it is no more A's
    _submission(inbound, A, B, "2026-01-14 12:00:00", "B's, named A")
    _submission(inbound, C, B, "2026-01-14 12:00:00", "B's, named C")
    _submission(inbound, A, A, "2026-01-14 13:00:00", "B's file", stranger=B)
    again = _collect(root, exchange, "--update")
    assert again.returncode == 0, again.stderr[-3000:]
    log = again.stderr
    assert log.count("REFUSED") == 3, log
    assert f"it names {A} but is owned by {B}; not collected" in log
    assert f"it names {C} but is owned by {B}; not collected" in log
    assert "cheating attempt" not in log  # refused, not collected with a warning
    submitted = root / "submitted"
    assert (submitted / A / CH / f"{CH}.ipynb").read_text() == "A's own"
    assert (submitted / B / CH / f"{CH}.ipynb").read_text() == "B's own"
    assert not (submitted / C).exists()
    # the refused ones stay in the exchange for the instructor to look at
    assert len(list(inbound.iterdir())) == 5
