"""Preloaded workers (``--preload``): a template imports modules once per node, each worker is forked from it.

``docs/preload.md`` describes the flag and what the template refuses. The modules:

- :mod:`~launcher.preload.preload`: the agent's side: starts the template, asks it for each
  worker, re-creates it when a module's file or the workers' environment changes.
- ``_preload_main.py``: the template process itself (run as a script, imports no launcher
  module): imports the modules, checks it is safe to fork, forks each worker.
- :mod:`~launcher.preload.exit_teardown`: destroys a gloo group a worker's code left alive before
  its interpreter finalises; run from its source by the template's workers, and imported by
  function (``--run-path``) workers.

The flag itself (``PreloadSettings``, its flag group) is parsed with the workers' flags in
:mod:`launcher.agent.settings`. This package imports nothing, so a launch without ``--preload``
never loads it.
"""
