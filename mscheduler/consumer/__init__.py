"""The async consumer: `consumer` (the task group), `listener` (change stream or polling),
`heap` (next-claim times), `executor` (handlers, pings, finish). It reaches MongoDB only
through `mscheduler.store`."""
