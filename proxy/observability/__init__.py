"""What the proxy tells its operator: access and operator logs (`logs`), OpenTelemetry traces
(`tracing`), Prometheus metrics (`metrics`, `metric_series`, `worker_metrics` for `--workers
N`), and its nodes' own `/metrics` (`node_gauges`, read by `prometheus_text`, the one
Prometheus text parser in ppd).
"""
