"""Circuits: attribution graphs and circuit discovery (anatomy/circuits/discovery)."""
