"""What the proxy sees of its nodes as they run, for `--policy live` and every policy that
reads `Turn.view`: vLLM's KV cache events (`kv_events`, `kv_subscriber`, `kv_sources`,
`kv_health`) folded into what each node still holds (`residency`); the view a policy reads
(`view` in the proxy, `cluster_view` the frozen snapshot); live's step-cost model (`predict`),
its score (`scorer`) and node choice (`nodes`); the turn rate (`load_meter`).
"""
