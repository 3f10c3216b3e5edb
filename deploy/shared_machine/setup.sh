#!/bin/sh
# Set up one shared Linux machine for the course: the nbgrader exchange folder, the
# system-wide nbgrader config, and private home folders. Run as root; safe to run again
# (it only creates what is missing and resets modes). Needs no network.
#
#   sh setup.sh --instructor USER [--course-clone DIR] [--exchange DIR]
#               [--config-dir DIR] [--python PATH] [--unit-dir DIR]
#               [--profile-dir DIR] STUDENT...
#
# --instructor USER   the instructor's login; their home folder is made private
# --course-clone DIR  the instructor's clone of the course (default: ~USER/attention-course)
# --exchange DIR      nbgrader's exchange folder (default: /srv/nbgrader/exchange)
# --config-dir DIR    where nbgrader_config.py goes, with attention_course_validate.py
#                     (default: /etc/jupyter)
# --python PATH       the course's Python, for the grading-on-submit service (default:
#                     python3 on root's PATH)
# --unit-dir DIR      where that service's systemd unit goes (default:
#                     /etc/systemd/system; installed, not enabled)
# --profile-dir DIR   where attention-course.sh goes, which puts the course's Python
#                     (--python's folder) first on every login shell's PATH, so that
#                     `python` and `nbgrader` are the course's in any terminal, a
#                     JupyterHub terminal included (default: /etc/profile.d)
# STUDENT...          the students' logins (their nbgrader student ids): homes made private
set -eu

here=$(cd "$(dirname "$0")" && pwd)
exchange=/srv/nbgrader/exchange
config_dir=/etc/jupyter
instructor=
clone=
python=
unit_dir=/etc/systemd/system
profile_dir=/etc/profile.d

die() {
    echo "setup.sh: $*" >&2
    exit 2
}

while [ $# -gt 0 ]; do
    case $1 in
    --instructor) instructor=${2:?}; shift 2 ;;
    --course-clone) clone=${2:?}; shift 2 ;;
    --exchange) exchange=${2:?}; shift 2 ;;
    --config-dir) config_dir=${2:?}; shift 2 ;;
    --python) python=${2:?}; shift 2 ;;
    --unit-dir) unit_dir=${2:?}; shift 2 ;;
    --profile-dir) profile_dir=${2:?}; shift 2 ;;
    --) shift; break ;;
    -*) die "unknown option $1 (see the top of this file)" ;;
    *) break ;;
    esac
done

[ "$(id -u)" -eq 0 ] || die "run me as root (sudo sh $0 ...)"
[ -n "$instructor" ] || die "--instructor USER is needed"
# The exchange path is written into a Python string: plain path characters only.
case $exchange in
/*) ;;
*) die "--exchange needs an absolute path" ;;
esac
case $exchange in
*[!A-Za-z0-9._/-]*) die "--exchange: use only letters, digits and . _ - / in the path" ;;
esac

home_of() {
    getent passwd "$1" | cut -d: -f6 | grep . || die "no such user: $1"
}

# 1. The exchange: writable by all, with the sticky bit, so a student can add their own
#    submission but never delete, rename or replace a folder another user made (without
#    it, any student could replace the course's folder). nbgrader itself would create it
#    0777, without the sticky bit; it keeps an existing one's (it checks the rwx bits only).
parent=$(dirname "$exchange")
[ -d "$parent" ] || install -d -m 0755 -o root -g root "$parent"
install -d -m 1777 -o root -g root "$exchange"

# 2. The system-wide nbgrader config, pointing at that exchange, and beside it a copy of
#    the course's Validate settings, which it loads (students cannot read the clone).
validate=$here/../../autograder/grading/recording/validate_settings.py
[ -f "$validate" ] || die "no $validate: run me from the deploy/ folder of a course clone"
[ -d "$config_dir" ] || install -d -m 0755 "$config_dir"
install -m 0644 -o root -g root "$validate" "$config_dir/attention_course_validate.py"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
sed "s#^c\.Exchange\.root = .*#c.Exchange.root = \"$exchange\"#" \
    "$here/nbgrader_config.py" >"$tmp"
grep -q "^c.Exchange.root = \"$exchange\"$" "$tmp" || die "could not set the exchange in the config"
install -m 0644 -o root -g root "$tmp" "$config_dir/nbgrader_config.py"

# 3. Private homes: no student may read another's notebooks or nbgrader's record of their
#    submissions (it holds the secret that names their feedback), nor the instructor's
#    clone (solutions, gradebook, everyone's submissions).
ihome=$(home_of "$instructor")
clone=${clone:-$ihome/attention-course}
chmod 0700 "$ihome"
if [ -d "$clone" ]; then
    chmod 0700 "$clone"
else
    echo "setup.sh: no course clone at $clone yet: clone it there, then run me again" >&2
fi
for student in "$@"; do
    home=$(home_of "$student")
    chmod 0700 "$home"
done

# 4. The grading sandbox needs unprivileged user namespaces for the instructor.
if ! runuser -u "$instructor" -- unshare --user --map-root-user --mount true 2>/dev/null; then
    echo "setup.sh: $instructor cannot create user namespaces, so the grader will not" \
        "start; run 'python -m autograder check' as $instructor for the fix" >&2
fi

# 5. Grading on submit: a systemd unit running `python -m autograder serve-submissions`
#    as the instructor, installed but not enabled (the instructor guide's "Feedback on
#    submit"): it grades the assignments the course's nbgrader_config.py switches on.
python=${python:-$(command -v python3 || true)}
case $python$clone$unit_dir in
*[!A-Za-z0-9._/-]*) die "--python, the clone and --unit-dir: use only letters, digits and . _ - / in paths" ;;
esac
if [ -n "$python" ] && [ -d "$unit_dir" ]; then
    unit=$unit_dir/attention-course-on-submit.service
    sed -e "s#@INSTRUCTOR@#$instructor#g" -e "s#@CLONE@#$clone#g" \
        -e "s#@PYTHON@#$python#g" -e "s#@EXCHANGE@#$exchange#g" \
        "$here/attention-course-on-submit.service" >"$tmp"
    install -m 0644 -o root -g root "$tmp" "$unit"
else
    echo "grading on submit: no systemd unit folder $unit_dir (or no python3): run" \
        "'$python -m autograder serve-submissions --exchange $exchange' as $instructor" \
        "in $clone, under your service manager" >&2
    unit=
fi

# 6. The course's Python on every login shell's PATH: a terminal (ssh, or JupyterLab's
#    on a hub, which starts a login shell) finds `python` and `nbgrader` there, as the
#    instructor guide's commands type them.
bin=$(dirname "${python:-/usr/bin/python3}")
case $bin in
/usr/bin | /bin | /usr/local/bin) ;;
*)
    if [ -d "$profile_dir" ]; then
        printf '%s\n' "# The attention course's Python first on PATH (deploy/shared_machine/setup.sh)" \
            "PATH=\"$bin:\$PATH\"; export PATH" >"$tmp"
        install -m 0644 -o root -g root "$tmp" "$profile_dir/attention-course.sh"
        echo "login shells: $bin first on PATH ($profile_dir/attention-course.sh)"
    else
        echo "setup.sh: no $profile_dir: put $bin on everyone's PATH yourself" >&2
    fi
    ;;
esac

echo "exchange $exchange (mode 1777), config $config_dir/nbgrader_config.py," \
    "private homes for $instructor and $# student(s)"
if [ -n "$unit" ]; then
    echo "grading on submit: $unit installed; switch it on with" \
        "'systemctl daemon-reload && systemctl enable --now attention-course-on-submit'"
fi
