"""The course's machinery, one job per subpackage.

- ``build``: chapter sources + solutions + hidden tests -> the nbgrader source and student
  notebooks (``python -m autograder build``).
- ``grading``: a submission run in the sandbox and judged (``python -m autograder grade``,
  ``autograde``; nbgrader's ``autograde`` through ``grading.nbgrader_bridge``).
- ``hidden_tests``, ``known_mistakes``: authored, one module per chapter: the hidden tests,
  and the plausible wrong answers the feedback names.
- ``course``: nbgrader's course root (its config, ``source/``, ``release/``, the gradebook).
"""
