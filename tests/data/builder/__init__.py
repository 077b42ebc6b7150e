"""Tests of the builder (osprey_data.builder)."""
