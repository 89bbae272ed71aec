"""``python -m mscheduler``: the ``mscheduler`` command."""

from mscheduler.cli.main import entry

entry()
