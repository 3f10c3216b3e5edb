"""The instructor's own nbgrader settings (``~/.jupyter/nbgrader_config.py``, put there by
``deploy/jupyterhub/setup.sh``): formgrader, which runs in the instructor's JupyterLab
from their home folder, loads the course's config from the course root, as nbgrader's
commands do when run from there. ``setup.sh`` writes the course root into the
``COURSE_ROOT`` line.
"""

from pathlib import Path

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)

COURSE_ROOT = "/home/teacher/attention-course/autograder/course"
# the exchange and the students' Validate, as for everyone (/etc/jupyter, or the folder
# setup.sh was given), come first; then the course's own config: the course root, the
# grader, the feedback
load_subconfig(str(Path(COURSE_ROOT) / "nbgrader_config.py"))  # noqa: F821
