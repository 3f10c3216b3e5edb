"""Grading: run a submission in the sandbox, call its exercises on fresh inputs, judge
the outputs against the references' (``grade`` drives it; ``judge.verdict`` decides)."""
