"""One module per chapter: the known mistakes (``MISTAKES``) of its exercises."""
