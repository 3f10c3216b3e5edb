"""Hidden tests, one module per chapter (named like its ``solutions`` module). See ``autograder.grading.judging.spec``."""
