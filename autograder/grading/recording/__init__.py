"""Where a verdict is recorded: nbgrader's gradebook (autograde.py, nbgrader_steps.py, provenance.py, completion.py), the feedback pages, and the Validate settings."""
