"""JupyterHub's settings for the course on one machine: PAM logins (the machine's own
accounts), each user's JupyterLab started as that user, formgrader for the instructor
only. ``setup.sh`` copies this file into the hub's folder (default ``/etc/jupyterhub``)
with ``attention_course_hub.json`` beside it, which names the instructor, the students and
the folder of the system-wide Jupyter config. Start the hub as root, from that folder::

    cd /etc/jupyterhub && jupyterhub -f jupyterhub_config.py

It listens on every address on port 8000 unless told otherwise
(``--ip 127.0.0.1 --port 8000``); put TLS in front of it (a reverse proxy, or
``c.JupyterHub.ssl_cert``/``ssl_key``) before students log in over a network.
"""

import json
import os
import sys
from pathlib import Path

c = get_config()  # noqa: F821 (provided by JupyterHub when it loads this file)

here = Path(__file__).resolve().parent
course = json.loads((here / "attention_course_hub.json").read_text())

# Logins: the machine's accounts, checked by PAM; only the course's users may log in, and
# only the instructor is the hub's admin. A student's nbgrader id is their login name.
c.JupyterHub.authenticator_class = "pam"
c.Authenticator.allowed_users = set(course["students"]) | {course["instructor"]}
c.Authenticator.admin_users = {course["instructor"]}
# PAM's "account" check needs more than the course's users have on some systems
# (an entry in /etc/shadow that is not expired is enough on Debian)
c.PAMAuthenticator.check_account = True
# Each user's server runs as that user, from their home, on loopback (the proxy reaches it)
c.JupyterHub.spawner_class = "localprocess"
c.Spawner.cmd = [str(Path(sys.executable).with_name("jupyterhub-singleuser"))]
c.Spawner.default_url = "/lab"
c.Spawner.notebook_dir = "~"
c.Spawner.ip = "127.0.0.1"
# Every user's server reads the course's system-wide Jupyter config (the exchange,
# Validate's settings, formgrader switched off and locked) before the Python
# installation's own, which enables every nbgrader extension; the instructor's own
# ~/.jupyter comes first for them alone (formgrader on, and pointed at the course).
# JUPYTER_CONFIG_PATH is read before ~/.jupyter, so it names both for the instructor.


def config_path(spawner) -> str:
    if spawner.user.name == course["instructor"]:
        home = Path(os.path.expanduser(f"~{spawner.user.name}"))
        return f"{home / '.jupyter'}:{course['config_dir']}"
    return course["config_dir"]


c.Spawner.environment = {"JUPYTER_CONFIG_PATH": config_path}
# The first start of a user's JupyterLab takes a while on a busy machine.
c.Spawner.start_timeout = 120
c.Spawner.http_timeout = 120

# Grading on submit: the hub starts `python -m autograder serve-submissions` as the
# instructor and restarts it if it stops. It grades the assignments the course's
# nbgrader_config.py lists in c.GradeOnSubmit.assignments (none: it waits; the list is
# read again every 10 s). Enable the shared machine's systemd unit instead only where no
# hub runs: one service per course (a second one refuses to start).
if course.get("clone"):
    serve = [
        sys.executable, "-m", "autograder", "serve-submissions",
        "--course-dir", f"{course['clone']}/autograder/course",
        "--exchange", course["exchange"], "--jobs", "2",
    ]  # fmt: skip
    c.JupyterHub.services = [
        {
            "name": "attention-course-on-submit",
            "user": course["instructor"],
            "command": serve,
            "cwd": course["clone"],
            "environment": {"PYTHONPATH": course["clone"], "PYTHONUNBUFFERED": "1"},
        }
    ]

# The hub's own state (its database and cookie secret) beside this file, not in the
# folder the hub happens to be started from.
c.JupyterHub.db_url = f"sqlite:///{here / 'jupyterhub.sqlite'}"
c.JupyterHub.cookie_secret_file = str(here / "jupyterhub_cookie_secret")
