"""The process-lifetime services: code that owns loops, task groups, waits and backoff, built
on the store's round trips (`store`). One of each per store (so per `Scheduler`), shared by
every consumer, waiter and watch of the process.

- `discovery`: the discovery hub (`TaskHub`): the process's one change stream, or its one
  poll loop, handing each subscriber the writes it wants (a package: subscriptions, filters,
  poller, hub);
- `controls`: the control hub (`ControlHub`): control changes from the hub's stream, a
  stream of its own on the version, or a read of it per poll interval;
- `runner`: `OneRunner`: one watch per process, the first caller runs it, the others stand by;
- `finishes`: the finish batcher (`FinishBatcher`): finishes in flight together go out as one
  bulk write;
- `waiting`: waiting for tasks to end, and watching them change (`Waiting`);
- `task_events`: task events (`TaskEvents`) derived from the writes the hub hands out.
"""
