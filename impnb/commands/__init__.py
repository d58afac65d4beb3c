"""The CLI subcommands, one per file."""
