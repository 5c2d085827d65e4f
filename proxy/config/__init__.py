"""The proxy's configuration, built and checked once at start-up: `settings` (`ProxyConfig`,
the flags and `config_from_args`), `policy_config` (`--policy` and every policy's flags, from
the registry), `cluster_file` (a cluster.json's nodes), `config_files` (the operator's files,
read within bounds), `preflight` (configuration and policy loaded without serving) and
`startup_line` (what the proxy logs when it is up).
"""
