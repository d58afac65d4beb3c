"""Mutated GGUFs and the runs that classify what impnb does with them (issue 38)."""
