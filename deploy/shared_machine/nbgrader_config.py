"""nbgrader's settings for everyone on one shared machine: install it as
``/etc/jupyter/nbgrader_config.py`` with ``setup.sh`` (which writes the exchange folder
it creates into the ``c.Exchange.root`` line). Students need nothing else; the
instructor's own course root (``autograder/course/nbgrader_config.py`` in their clone of
the course) adds the grader's settings on top.

This file is read by every student's nbgrader, where the course repository is not
readable: it must not import anything from it.
"""

import sys
from pathlib import Path

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)

# The exchange: one folder every user can write into, with the sticky bit (mode 1777), so
# that no student can delete or replace what another user put there (setup.sh makes it).
c.Exchange.root = "/srv/nbgrader/exchange"
# The course students fetch from and submit to when they give no --course.
c.CourseDirectory.course_id = "attention-course"
# Validate (the button students press, `nbgrader validate`): the course's settings, from
# the copy of autograder/grading/recording/validate_settings.py that setup.sh puts beside this file.
# It runs every cell and fails on an error: the visible checks after each exercise raise
# on an untouched stub and on the mistakes they catch.
VALIDATE = Path(__file__).with_name("attention_course_validate.py")
if not VALIDATE.is_file():  # nbgrader would go on silently with its weaker defaults
    print(
        f"[attention-course] {VALIDATE} is missing: Validate checks less than it should."
        " Ask your instructor to run deploy/shared_machine/setup.sh again.",
        file=sys.stderr,
    )
load_subconfig(VALIDATE.name)  # noqa: F821 (provided by nbgrader)
