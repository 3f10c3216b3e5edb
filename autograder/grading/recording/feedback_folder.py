"""The exchange's feedback folder, there from the first release on.

nbgrader's ``fetch_feedback`` (the command, and *Fetch Feedback* in JupyterLab's
*Assignments* tab) fails when ``<exchange>/<course>/feedback`` does not exist: it logs
"Assignment not found" at CRITICAL, and the tab's server logs a traceback. nbgrader only
makes that folder at the first ``release_feedback``, so a student who presses the button
before any feedback was returned hit it. With the folder there, a fetch that finds
nothing for the student logs a warning ("Could not find feedback for ...") and succeeds.

:class:`ReleaseWithFeedbackFolder` (``c.ExchangeFactory.release_assignment`` in the
course config) makes the folder beside ``outbound/`` and ``inbound/`` when it makes them,
with the mode ``release_feedback`` gives it (students may enter it, never list it). The
grading-on-submit service makes it too (:func:`ensure`), for a course released before.
"""

from __future__ import annotations

import os
from pathlib import Path
from stat import S_IRGRP, S_IRWXU, S_ISGID, S_IWGRP, S_IXGRP, S_IXOTH

from nbgrader.exchange.default.release_assignment import ExchangeReleaseAssignment


def mode(groupshared: bool = False) -> int:
    """The mode nbgrader's ``release_feedback`` gives the folder (0o711: the owner lists
    it; everyone else may only open a page whose name they know)."""
    return (
        S_IRWXU
        | S_IXGRP
        | S_IXOTH
        | ((S_IRGRP | S_IWGRP | S_ISGID) if groupshared else 0)
    )


def ensure(exchange: Path, course_id: str, groupshared: bool = False) -> Path | None:
    """Make ``<exchange>/<course_id>/feedback`` with nbgrader's mode if the course's
    folder is there and the feedback folder is not; its path, or None (no course folder
    yet: ``release_assignment`` makes that one)."""
    course = Path(exchange) / course_id
    folder = course / "feedback"
    if folder.is_dir() or not course.is_dir():
        return folder if folder.is_dir() else None
    try:
        folder.mkdir()
    except FileExistsError:
        return folder
    os.chmod(folder, mode(groupshared))  # mkdir's mode is cut by the umask
    return folder


class ReleaseWithFeedbackFolder(ExchangeReleaseAssignment):
    """``nbgrader release_assignment``, then the course's feedback folder (see above)."""

    def init_dest(self):
        super().init_dest()  # the course's folder, outbound/ and inbound/
        folder = ensure(self.root, self.coursedir.course_id, self.coursedir.groupshared)
        if folder is not None:
            self.log.info("Feedback folder: %s", folder)
