"""The ``mscheduler`` command, one module per command group.

- ``main``: the typer app, its global options, every command on one screen;
- ``tasks``: ``publish``, ``show``, ``ls``, ``cancel``, ``retry``, ``purge``;
- ``show``: the report ``show`` prints for one task;
- ``observe``: ``stats``, ``workers`` (and ``workers stop``), ``watch``, ``events``, ``indexes``;
- ``pauses``: ``pause``, ``resume``;
- ``limits``: ``limit set``, ``ls``, ``rm``;
- ``schedules``: ``schedule add``, ``ls``, ``rm``;
- ``worker``: ``worker``, handlers from an import path served until a signal;
- ``dashboard``: ``dashboard``, the web dashboard with uvicorn;
- ``serve``: ``serve``, the HTTP API with uvicorn;
- ``demo``: ``demo``, a realistic mix of tasks run live;
- ``common``: what every command shares (settings, one-line errors, the database session);
- ``inputs``: what the shell hands a command (durations, times, JSON, files);
- ``output``: what read commands print (extended JSON, tables);
- ``logs``: the command's logging (text or JSON lines).
"""
