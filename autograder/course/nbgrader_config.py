"""nbgrader configuration: this folder (``autograder/course/``) is the course root.

Instructors run nbgrader's commands from here, as its documentation describes::

    cd autograder/course
    nbgrader generate_assignment 03_self_attention --force
    nbgrader autograde 03_self_attention
    nbgrader generate_feedback 03_self_attention
    nbgrader export

``python -m autograder build`` writes ``source/`` (and ``release/`` through
``generate_assignment``); student submissions go to ``submitted/<student>/<assignment>/``.
"""

import functools
import importlib.util
import sys
import warnings
from pathlib import Path

from nbconvert.preprocessors import CSSHTMLHeaderPreprocessor
from nbgrader.preprocessors import (
    AssignLatePenalties,
    CheckCellMetadata,
    ClearOutput,
    DeduplicateIds,
    GetGrades,
    LimitOutput,
    OverwriteCells,
    OverwriteKernelspec,
    SaveAutoGrades,
)

c = get_config()  # noqa: F821 (provided by nbgrader when it loads this file)

course_root = Path(__file__).resolve().parent
# the course repository, when this is its autograder/course/
repo = course_root.parents[1]

c.CourseDirectory.root = str(course_root)
c.ClearSolutions.code_stub = {"python": "# YOUR CODE HERE\nraise NotImplementedError()"}
c.ClearSolutions.enforce_metadata = True
# Student code runs in the grading sandbox, never beside the course files: our grader
# takes the place of nbgrader's Execute step (see autograder/grading/nbgrader_bridge.py).
# Only the course repository goes on the path: a course root copied elsewhere (two folders
# below /, say) would otherwise put an unrelated folder there, which the sandbox then
# shows the student's kernel. Such a root needs the repository on PYTHONPATH.
if (repo / "autograder" / "grading" / "nbgrader_bridge.py").is_file():
    sys.path.insert(0, str(repo))
try:
    from autograder.grading.nbgrader_bridge import (
        COURSE_ID,
        RestoreHiddenTests,
        SandboxedExecute,
        feedback_hook,
        prove_sandbox,
        recorded_hook,
    )
    from autograder.grading.recording.feedback_folder import ReleaseWithFeedbackFolder
    from autograder.grading.recording.owned_collect import OwnedCollect
    from autograder.grading.recording.safe_feedback import (
        FeedbackClearHiddenTests,
        FeedbackExporter,
    )
    from autograder.grading.recording.validate_settings import configure_validate
except Exception as exc:  # noqa: BLE001
    # nbgrader logs a config file's errors and goes on with its defaults, which would run
    # every submission unjailed beside the course files and record what it scores.
    # SystemExit is not caught: nbgrader stops here, before anything is graded.
    print(
        f"[autograder] cannot load the course's grader from {repo} ({exc!r}); "
        "nothing was graded. Run nbgrader from autograder/course/ in the course "
        "repository, or put the repository on PYTHONPATH.",
        file=sys.stderr,
        flush=True,
    )
    raise SystemExit(3) from None

c.CourseDirectory.course_id = COURSE_ID

# `nbgrader collect` takes a submission only from the student it names: one whose files
# another login owns (`nbgrader submit --student alice`, run by bob) is refused and
# logged, and alice's own is collected (autograder/grading/recording/owned_collect.py).
# For nbgrader's own exchange (a folder) only: where ngshare is installed, its exchange
# (set in the global config, which this file would override) knows who submitted.
# `c.CollectApp.check_owner = False` turns the check off (one uid for every user).
if importlib.util.find_spec("ngshare_exchange") is None:
    c.ExchangeFactory.collect = OwnedCollect
    # `nbgrader release_assignment` also makes the exchange's feedback folder (as
    # release_feedback would): without it, a student's Fetch Feedback before any
    # feedback was returned fails with a CRITICAL error and a traceback
    # (autograder/grading/recording/feedback_folder.py).
    c.ExchangeFactory.release_assignment = ReleaseWithFeedbackFolder

# Late work (submitted after the due date set with `nbgrader db assignment add ...
# --duedate=...`): "zero" records 0 points for it; "none" keeps its score.
c.LateSubmissionPlugin.penalty_method = "zero"

# Before the first submission enters the gradebook: prove the jail, or stop (exit 3).
# Before each student is recorded, their completion mark goes; once nbgrader has recorded
# them completely, it is written (autograder/grading/recording/completion.py): a stop in between
# leaves a student that `python -m autograder autograde` records again, never a half
# record taken for a finished one. The same for each feedback page.
db_url = f"sqlite:///{course_root / 'gradebook.db'}"
c.Autograde.pre_convert_hook = functools.partial(
    prove_sandbox, db_url=db_url, course_id=COURSE_ID
)
c.Autograde.post_convert_hook = functools.partial(recorded_hook, db_url=db_url)
c.GenerateFeedback.pre_convert_hook = functools.partial(
    feedback_hook, db_url=db_url, done=False
)
c.GenerateFeedback.post_convert_hook = functools.partial(
    feedback_hook, db_url=db_url, done=True
)
# nbgrader 0.9's Gradebook.add_submission builds a new submission through relationship
# backrefs and reads `submission.assignment.notebooks` before it adds the submission to
# the session; SQLAlchemy 2 no longer cascades backrefs into the session, so the
# autoflush that read triggers warns "Object of type <SubmittedAssignment> not in
# session" (and <SubmittedNotebook>) for every new submission. Harmless: the
# `db.add(submission)` a few lines later adds the whole submission, notebooks and grades
# (tests/test_class_autograde.py compares every grade with serial nbgrader's), but it
# reads like an error in every log. nbgrader's code, not ours: filtered, exactly.
warnings.filterwarnings(
    "ignore",
    message=r"Object of type <Submitted(Assignment|Notebook)> not in session, add "
    r"operation along '(Student|Assignment|Notebook)\.submissions' will not proceed",
)
# nbgrader's own steps, with the released hidden-test cells given their hidden tests back
# first, so that only a cell the student really edited is logged as changed.
c.Autograde.sanitize_preprocessors = [
    ClearOutput,
    DeduplicateIds,
    OverwriteKernelspec,
    RestoreHiddenTests,
    OverwriteCells,
    CheckCellMetadata,
]
c.Autograde.autograde_preprocessors = [
    SandboxedExecute,
    LimitOutput,
    SaveAutoGrades,
    AssignLatePenalties,
    CheckCellMetadata,
]
# A student's Validate (nbgrader validate) runs every cell: the visible checks decide.
configure_validate(c)

# nbconvert checks the notebook against its schema after each of nbgrader's preprocessors
# (15 a submission, autograde and feedback together); once, after the last, refuses the
# same notebooks, and takes about a tenth off recording a class.
c.Exporter.optimistic_validation = True

# Feedback shows each test's message, not the hidden test code, and runs nothing the
# student wrote: markdown, raw cells and outputs are sanitised (safe_feedback.py).
c.GenerateFeedback.exporter_class = FeedbackExporter
c.GenerateFeedback.preprocessors = [
    GetGrades,
    FeedbackClearHiddenTests,
    CSSHTMLHeaderPreprocessor,
]
