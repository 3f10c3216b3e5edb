"""What a student's Validate button (``nbgrader validate NOTEBOOK``) checks in this course.

The released notebook's graded cells hold only comments (the hidden tests run at grading
time), so nbgrader's default Validate, which looks at graded cells only, says "Success!"
for an untouched notebook and for a wrong one. Here Validate checks every cell
(``Validator.validate_all``): the visible checks after each exercise raise on the stub and
on the mistakes they catch, so those fail it. Text a cell writes to stderr (tqdm's progress
bars, warnings) is no failure, though nbgrader's Validator counts any as one: the kernel
Validate starts writes its stderr to stdout (:data:`STDERR_TO_STDOUT`), so an exception,
not a message, is what fails. (``Validator.preprocessors`` is not configurable in nbgrader
0.9.6, and Validate never saves the outputs of its run: the notebook is left as it was.)

One file, two ways to load it, so the settings live in one place:

* the course's own ``autograder/course/nbgrader_config.py`` imports it and calls
  :func:`configure_validate`;
* a machine-wide student config (``/etc/jupyter/nbgrader_config.py`` on a shared machine,
  where the course's repository is not readable to students) loads a world-readable copy
  of this file as a config file: ``load_subconfig("/path/to/validate_settings.py")``.
  It imports nothing.
"""

# Seconds one cell may run under Validate. A student's laptop can be slower than the
# machine that grades, so this is more patient than the grader's own limit per cell.
CELL_TIMEOUT = 600
# Run in the kernel before the notebook: tqdm, warnings and print(file=sys.stderr) all
# write to sys.stderr when they write, so all of it goes to stdout.
STDERR_TO_STDOUT = "--IPKernelApp.exec_lines=import sys; sys.stderr = sys.stdout"


def configure_validate(c) -> None:
    """Put the course's Validate settings into the traitlets config ``c``."""
    c.Validator.validate_all = True
    c.Execute.timeout = CELL_TIMEOUT
    c.Execute.extra_arguments = [STDERR_TO_STDOUT]


if "get_config" in globals():  # loaded as a config file (load_subconfig), not imported
    configure_validate(get_config())  # noqa: F821 (provided by traitlets' loader)
