"""Rendezvous: how the agents of a job find each other and agree on ranks."""
