"""Grading, one folder for each place a submission passes through:

- ``running/``: where it runs: the jail (``sandbox/``), its kernel and cells
  (``execute.py``), the limits it runs under, the canary that proves the jail;
- ``sealed/``: where its hidden tests run: the sealed child of its kernel (``probe.py``),
  the window the grader opens around it (``window.py``), the attention guard (``guard/``)
  and the reader of what the child writes (``result_reader.py``);
- ``judging/``: where it is judged, in the grader's own process (``judge.verdict``);
- ``recording/``: where the verdict is recorded: nbgrader's gradebook and the feedback.

``grade.py`` drives them for one notebook or a batch, ``check.py`` tests a machine before a
deadline, and ``nbgrader_bridge.py`` is the module nbgrader loads (the course config and the
notebooks' hidden-test cells name it, so it stays where it is)."""
