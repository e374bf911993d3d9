"""Runnable demos of the course: run one with ``python -m tutorials.demos.<name>`` from the repo root."""
