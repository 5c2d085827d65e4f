"""The readback route's wire protocol as pure functions (`protocol`, docs/readback.md): what D
keeps of a finished turn, and the params P reads it back with. The router's steps are
`proxy.routing.readback_legs`; the book of what each D keeps is in `proxy.sessions`.
"""
