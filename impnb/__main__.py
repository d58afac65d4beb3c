"""`python -m impnb` entry point."""

from impnb.cli import main

raise SystemExit(main())
