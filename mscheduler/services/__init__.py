"""The process-lifetime services: code that owns loops, task groups and backoff, built on
the store's round trips."""
