"""Sessions: which conversation a request continues and what its D holds (`session`), kept
by a store (`store`): in this process (`ledger`) or in Redis/Valkey (`redis_store`), as
`--session-store` names it (`open_store`).
"""
