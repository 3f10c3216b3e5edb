"""Build and grade the course: chapter sources + solutions + hidden tests -> nbgrader notebooks -> grades.

``python -m autograder build`` derives every notebook; ``python -m autograder grade`` grades
student notebooks. This folder is also the nbgrader course root (see ``nbgrader_config.py``).
"""
