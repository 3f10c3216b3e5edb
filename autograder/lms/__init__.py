"""Grades where the university keeps them (``python -m autograder export --lms ...``):
``gradebook`` reads each roster student's grade of each assignment from nbgrader's
gradebook, with the late penalty the course's settings give; ``formats`` writes them
as the gradebook-import CSV that Canvas, Moodle or Blackboard Learn documents. It
neither grades nor changes the gradebook."""
