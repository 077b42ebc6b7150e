"""Tests of the builder (osprey_data.build)."""
