"""`python -m impnb` entry point."""

from impnb.cli import entry

entry()
