"""Osprey training: drafter models, the four stages, evaluation and export."""
