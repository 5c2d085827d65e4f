"""Behaviour of the whole proxy (served, or through the router's seams), across modules: request
flows, faults, hostile input, clients; the files beside this folder test one module each."""
