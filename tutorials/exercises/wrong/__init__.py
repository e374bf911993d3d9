"""Deliberately wrong solutions: each shows one mistake, and tests/test_exercises.py checks the grader's verdict on it."""
