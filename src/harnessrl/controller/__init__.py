"""Launching harnesses for queued rollouts, scoring them, and recording outcomes."""
