"""The worker: runs handlers for the tasks of some names. It reaches MongoDB only through
`mscheduler.store`.

- ``consumer``: `Consumer`, its task group: builds the parts below and wires them once, each
  to the narrow collaborators it needs (no part receives the consumer);
- ``stopping``: its stop, as the parts see it: asked for, then complete;
- ``group``: several consumers started and stopped together;
- ``listener``: the discovery hub's events of its names, handed to the intake;
- ``intake``: each task heard or read, to the executor, the limiter and the claimer's heap;
  the fetches; the dependents a writer did not tell;
- ``heap``: what it may claim next, one entry per key, earliest first (the claimer's);
- ``claimer``: the claim path: owns the heap and the claim policy; claims what is due, puts
  back the rest, recovers lost replies, stops a consumer whose work is done;
- ``claimable``: when this worker might claim a task (the claim filter's client-side half);
- ``spread``: the ``spread`` claim policy (long tasks shared across the live workers);
- ``limits``: `Limiter`, the one claim core of every surface (the consumer, `own`, isolated
  handlers): the tokens a claim of a limited name takes, confirms, extends and frees;
- ``controls``: schedules, pauses, limits and a remote stop, kept current;
- ``executor``: running handlers: local retries, pings, the fenced finish, release;
- ``takeover``: a lease taken over from another worker, logged and counted;
- ``calls``: one handler call (its own asyncio task, a thread for ``def``, the time limit);
- ``handlers``: the registry (`Handlers`), ``retry_on``, `isolated`;
- ``batching``: `mscheduler.handlers.batch`, one handler call for many tasks;
- ``isolation``: the worker's pool of child processes for isolated handlers;
- ``child``: a child process's side of isolated handlers;
- ``owner``: the pull API (`Scheduler.own`), through the same claim core;
- ``presence``: its entry in the live workers, and the peer counts of the claim policy;
- ``stats``: what it counts, and the observers told (the exporters of `observability`).
"""
