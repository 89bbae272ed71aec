"""What a worker reports to the outside, each turned on by the application, never by us:

- ``prometheus``: the Prometheus exporter (``pip install 'mscheduler[metrics]'``), fed by
  `ConsumerStats` observers and `Scheduler.stats`;
- ``otel_metrics``: the same figures through OpenTelemetry's metrics API (``mscheduler[otel]``);
- ``tracing``: OpenTelemetry traces, a task run inside the trace that published it.
"""
