"""The course's machinery, one job per subpackage.

- ``build``: chapter sources + solutions + hidden tests -> the nbgrader source and student
  notebooks (``python -m autograder build``).
- ``grading``: a submission run in the sandbox and judged (``python -m autograder grade``,
  ``autograde``; nbgrader's ``autograde`` through ``grading.nbgrader_bridge``).
- ``hidden_tests``, ``known_mistakes``: authored, one module per chapter: the hidden tests,
  and the plausible wrong answers the feedback names.
- ``course``: nbgrader's course root (its config, ``source/``, ``release/``, the gradebook).
"""

import os
import sys

# The grader computes on CPU tensors, so chapter 11's Triton kernels (the reference's and
# the known mistakes') run in Triton's interpreter, on a machine with a GPU too. Triton
# reads this once, when it is first imported: here, before anything of ours imports it.
os.environ["TRITON_INTERPRET"] = "1"

# jsonschema, which nbformat imports, imports rfc3987-syntax (Jupyter's extras install it)
# for its "iri" formats, and that package builds an Earley parser as it is imported:
# about 2 s of CPU in every process of ours that reads a notebook (each command, each
# recording worker), before anything else. No notebook or gradebook schema checks an
# IRI; without the package, jsonschema leaves those formats unchecked.
sys.modules.setdefault("rfc3987_syntax", None)
