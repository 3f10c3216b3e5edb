#!/bin/sh
# Set up the course on a JupyterHub on one machine: everything deploy/shared_machine/setup.sh
# does (the exchange, the system-wide nbgrader config, private homes and course), and
# then the hub's config, formgrader for the instructor alone, and the instructor's
# nbgrader config pointing at the course root. Run as root; safe to run again. Needs no
# network.
#
#   sh setup.sh --instructor USER [--course-clone DIR] [--exchange DIR]
#               [--config-dir DIR] [--hub-dir DIR] [--python PATH] [--unit-dir DIR]
#               [--profile-dir DIR] STUDENT...
#
# --python PATH   the course's Python, with JupyterHub, which every user must be able to
#                 run (default: python3 on root's PATH)
# --hub-dir DIR   where jupyterhub_config.py goes, with attention_course_hub.json (the
#                 instructor, the students, the config folder) (default: /etc/jupyterhub)
# the other options: as in deploy/shared_machine/setup.sh
set -eu

here=$(cd "$(dirname "$0")" && pwd)
config_dir=/etc/jupyter
hub_dir=/etc/jupyterhub
instructor=
clone=
exchange=/srv/nbgrader/exchange
pass=
python=

die() {
    echo "setup.sh: $*" >&2
    exit 2
}

while [ $# -gt 0 ]; do
    case $1 in
    --instructor) instructor=${2:?}; pass="$pass --instructor $2"; shift 2 ;;
    --course-clone) clone=${2:?}; pass="$pass --course-clone $2"; shift 2 ;;
    --exchange) exchange=${2:?}; pass="$pass --exchange $2"; shift 2 ;;
    --config-dir) config_dir=${2:?}; pass="$pass --config-dir $2"; shift 2 ;;
    --hub-dir) hub_dir=${2:?}; shift 2 ;;
    --unit-dir) pass="$pass --unit-dir ${2:?}"; shift 2 ;;
    --profile-dir) pass="$pass --profile-dir ${2:?}"; shift 2 ;;
    --python) python=${2:?}; pass="$pass --python $2"; shift 2 ;;
    --) shift; break ;;
    -*) die "unknown option $1 (see the top of this file)" ;;
    *) break ;;
    esac
done
for path in "$config_dir" "$hub_dir" ${clone:+"$clone"}; do
    case $path in
    /*) ;;
    *) die "$path: use an absolute path" ;;
    esac
    case $path in
    *[!A-Za-z0-9._/-]*) die "$path: use only letters, digits and . _ - / in the path" ;;
    esac
done

# 1. The machine, as for a course without a hub (no option above has spaces in it)
# shellcheck disable=SC2086
sh "$here/../shared_machine/setup.sh" $pass -- "$@"

ihome=$(getent passwd "$instructor" | cut -d: -f6)
clone=${clone:-$ihome/attention-course}
course_root=$clone/autograder/course
case $course_root in
"$ihome"/*) ;;
*) die "the course ($clone) must lie in $instructor's home, the root of their" \
    "Jupyter server: formgrader shows only an error for a course root outside it" ;;
esac

# 2. Every user's Python: the hub starts each user's server with their own rights, so
#    the installation must be readable and runnable by all (not under root's home).
python=${python:-$(command -v python3 || true)}
[ -n "$python" ] || die "no python3 on root's PATH: name the course's Python with --python"
for user in "$instructor" ${1:+"$1"}; do # the instructor and a student (as all students)
    if ! runuser -u "$user" -- "$python" -c "import jupyterhub, nbgrader" 2>/dev/null; then
        die "$user cannot run $python with jupyterhub and nbgrader: install the" \
            "course's Python for everyone (see the instructor guide), then run me again"
    fi
done

# 3. formgrader and "create assignment" off for everyone, in the system-wide config the
#    hub puts first on every user's config path (JUPYTER_CONFIG_PATH); locked, so that
#    a student cannot switch them back on in JupyterLab's extension manager.
install -d -m 0755 "$config_dir/jupyter_server_config.d" "$config_dir/labconfig"
install -m 0644 "$here/system/jupyter_server_config.d/attention-course.json" \
    "$config_dir/jupyter_server_config.d/attention-course.json"
install -m 0644 "$here/system/labconfig/page_config.json" "$config_dir/labconfig/page_config.json"

# 4. ... and on for the instructor: their own ~/.jupyter (read before the system's)
#    unlocks and enables them, lets formgrader's frame show (JupyterHub's servers forbid
#    every frame), and points nbgrader at the course root.
jdir=$ihome/.jupyter
# written by the instructor's own account (root reads the source and feeds it in): root
# writes nothing into a folder another user controls
put() { # SOURCE DEST: a file of the instructor's, mode 0600
    runuser -u "$instructor" -- sh -c 'umask 077 && cat >"$1"' sh "$2" <"$1"
}
runuser -u "$instructor" -- mkdir -p -m 0700 "$jdir" "$jdir/labconfig"
put "$here/instructor/jupyter_server_config.json" "$jdir/jupyter_server_config.json"
put "$here/instructor/labconfig/page_config.json" "$jdir/labconfig/page_config.json"
tmp=$(mktemp)
trap 'rm -f "$tmp"' EXIT
sed "s#^COURSE_ROOT = .*#COURSE_ROOT = \"$course_root\"#" \
    "$here/instructor/nbgrader_config.py" >"$tmp"
grep -q "^COURSE_ROOT = \"$course_root\"$" "$tmp" || die "could not set the course root"
put "$tmp" "$jdir/nbgrader_config.py"

# 5. The hub's config, and who is who
install -d -m 0700 "$hub_dir"
install -m 0644 "$here/jupyterhub_config.py" "$hub_dir/jupyterhub_config.py"
"$python" - "$hub_dir/attention_course_hub.json" "$instructor" "$config_dir" "$clone" "$exchange" "$@" <<'PY'
import json, sys
out, instructor, config_dir, clone, exchange, *students = sys.argv[1:]
with open(out, "w") as f:
    json.dump({"instructor": instructor, "students": students, "config_dir": config_dir,
               "clone": clone, "exchange": exchange}, f, indent=1)
PY
chmod 0600 "$hub_dir/attention_course_hub.json"

echo "hub config $hub_dir/jupyterhub_config.py, formgrader for $instructor only," \
    "course root $course_root"
