"""The ``mscheduler`` command: `main` (the typer app and its commands), `demo` (the
embedded demo) and `worker` (running handlers from the command line)."""
