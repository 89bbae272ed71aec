"""The process-lifetime services: code that owns loops, task groups, waits and backoff, built
on the store's round trips (`store`). One of each per store (so per `Scheduler`), shared by
every consumer, waiter and watch of the process.

- `root`: the composition root (`Services`): builds the store, then every service below over
  it, and hands the store what its writes tell them; what the `Scheduler` holds;
- `discovery`: the discovery hub (`TaskHub`): the process's one change stream, or its one
  poll loop, handing each subscriber the writes it wants (a package: subscriptions, filters,
  poller, hub);
- `controls`: the control hub (`ControlHub`): control changes from the hub's stream, a
  stream of its own on the version, or a read of it per poll interval;
- `runner`: `Service`, the one start/stop contract of a loop-owning service (served in its
  caller's task group, stopped by cancelling it), and `OneRunner`: one watch per process, the
  first caller runs it, the others stand by;
- `finishes`: the finish batcher (`FinishBatcher`): finishes in flight together go out as one
  bulk write (the store sends its finishes through it: `store.finishes.FinishWrites`);
- `claim_turns`: `ClaimTurns`, the process's turns at batched claims and how wide they read;
- `dependents`: `OwedDependents`, the finished tasks whose dependents this process failed to
  tell, and the consumers woken to tell them;
- `waiting`: waiting for tasks to end, and watching them change (`Waiting`);
- `task_events`: task events (`TaskEvents`) derived from the writes the hub hands out.
"""
