"""The agent: runs one node's workers through rendezvous, monitoring, restarts and shutdown."""
