"""Reference implementations: one module per chapter, the answers the grader compares against.

Each public function or class here has a stub of the same signature in its chapter
(``chapters/NN_<module>/NN_<module>.md``). The stub's docstring is the contract;
``python -m autograder build`` copies the bodies below into the nbgrader source
notebooks, so these bodies may use only names the chapter notebook defines
(``math``, ``torch``, ``nn``, ``F`` and the chapter's own earlier exercises).
"""
