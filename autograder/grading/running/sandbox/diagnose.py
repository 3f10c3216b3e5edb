"""Why the jail could not start on this machine, and the one fix that applies.

Read by the grader (never by student code) when the zygote or the canary kernel fails:
the facts come from ``/proc`` (``proc`` is a parameter so tests can fake a host).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

APPARMOR_PROFILE = Path(__file__).with_name("apparmor") / "course-grader"

_DOCKER = (
    "docker run --security-opt seccomp=unconfined --security-opt apparmor=unconfined "
    "--security-opt systempaths=unconfined ..."
)
_KUBERNETES = (
    "in the pod's securityContext: seccompProfile {type: Unconfined}, appArmorProfile "
    "{type: Unconfined} and procMount: Unmasked (with hostUsers: false), or "
    "privileged: true"
)


def _read(proc: Path, name: str) -> str | None:
    try:
        return (proc / name).read_text().strip()
    except OSError:
        return None


def in_container(proc: Path = Path("/proc")) -> bool:
    if os.path.exists("/.dockerenv") or os.path.exists("/run/.containerenv"):
        return True
    cgroup = _read(proc, "1/cgroup") or ""
    return any(
        word in cgroup for word in ("docker", "kubepods", "containerd", "libpod")
    )


def seccomp_filtered(proc: Path = Path("/proc")) -> bool:
    status = _read(proc, "self/status") or ""
    return any(line.split() == ["Seccomp:", "2"] for line in status.splitlines())


def cause(error: str, proc: Path = Path("/proc"), uid: int | None = None) -> str:
    """The cause and the fix, in one paragraph."""
    uid = os.getuid() if uid is None else uid
    python = os.path.realpath(sys.executable)
    if "No module named" in error or "No such file" in error:
        return (
            "the jail does not show a part of the Python installation the kernel needs. "
            "Please report this with the error below; meanwhile, keep the Python "
            "installation (venv, conda) outside the folders of the submissions."
        )
    denied = not error.strip() or any(
        word in error
        for word in (
            "not permitted",
            "Permission denied",
            "unshare",
            "mount",
            "pivot_root",
            "id maps",
        )
    )
    if not denied:
        return (
            "the canary submission did not run as it must (see the error below). Please "
            "report it; nothing else is wrong with this machine that the grader can see."
        )
    if _read(proc, "sys/kernel/unprivileged_userns_clone") == "0":
        return (
            "unprivileged user namespaces are disabled on this host "
            "(kernel.unprivileged_userns_clone=0). Fix, once, as root: "
            "sudo sysctl -w kernel.unprivileged_userns_clone=1 (and add it to "
            "/etc/sysctl.d/ to keep it after a reboot)."
        )
    if _read(proc, "sys/user/max_user_namespaces") == "0":
        return (
            "user namespaces are disabled on this host (user.max_user_namespaces=0). "
            "Fix, once, as root: sudo sysctl -w user.max_user_namespaces=15000 (and add "
            "it to /etc/sysctl.d/)."
        )
    if (
        uid != 0
        and _read(proc, "sys/kernel/apparmor_restrict_unprivileged_userns") == "1"
    ):
        copies = (
            ""
            if not python.startswith(("/usr/", "/bin/"))
            else " (this interpreter is the system's: make a venv with `python3 -m venv "
            "--copies /opt/course-grader`, install the course there and grade with it, "
            "so the profile applies to that copy only)"
        )
        return (
            "AppArmor restricts unprivileged user namespaces on this host "
            "(kernel.apparmor_restrict_unprivileged_userns=1, as on Ubuntu 23.10 and "
            "later): the jail's namespace has no rights, so its mounts fail. Fix, once, "
            f"as root, with the profile this course ships{copies}: sed "
            f"'s#@PYTHON@#{python}#' {APPARMOR_PROFILE} | sudo tee "
            "/etc/apparmor.d/course-grader && sudo apparmor_parser -r "
            "/etc/apparmor.d/course-grader. (Or, for the whole host: sudo sysctl -w "
            "kernel.apparmor_restrict_unprivileged_userns=0.)"
        )
    if in_container(proc) or seccomp_filtered(proc):
        return (
            "this grader runs in a container whose security settings forbid the jail "
            "(Docker's default seccomp profile blocks unshare, its AppArmor profile "
            "blocks mount, and its masked /proc blocks a new /proc). Run the container "
            f"with: {_DOCKER}; on Kubernetes, {_KUBERNETES}."
        )
    return (
        "Linux user namespaces are needed (unshare, mount and pivot_root inside one); "
        "this host refused them. Check `unshare -Urm true` as the grading user."
    )


def explain(error: str, proc: Path = Path("/proc"), uid: int | None = None) -> str:
    """The message the grader stops with: nothing graded, the cause, the fix, the error."""
    return (
        "The grading sandbox cannot start on this machine, so nothing was graded and no "
        f"grade was recorded. Cause: {cause(error, proc, uid)} "
        f"(error: {error.strip()[-500:] or 'none reported'})"
    )
