"""Reference solutions of the exercises, one file each, graded by tests/test_exercises.py."""
