"""ppd's offline tools: models, local clusters, trace replay, profiling, reports."""
