"""Grading on submit (``python -m autograder serve-submissions``): a service that grades
each submission as it reaches the exchange, with the course's grader in its jail, and
puts the feedback page where ``nbgrader fetch_feedback`` and the Assignments tab find it.

One job per module: ``settings`` (which assignments, attempts, cool-down, keep),
``inbound`` (the exchange's submissions, oldest first, and who owns them), ``journal``
(what happened to each submission, fsync'd: nothing lost, nothing graded twice),
``attempts`` (graded now or kept until the due date; which attempt the gradebook keeps),
``pages`` (the feedback page and its attempts line), ``service`` (the loop).
"""
