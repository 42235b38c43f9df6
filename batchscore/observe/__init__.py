"""Observing a run: its counters and report (`report`), live progress (`progress`), Prometheus
metrics (`metrics`) and log lines for people or collectors (`logs`)."""
