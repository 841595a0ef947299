"""Health checks: before each round it joins, a node checks itself; a sick node stays out.

The pieces, one module each: what a check sees and answers (:mod:`~launcher.health.api`), the
flags (:mod:`~launcher.health.settings`), running checks in parallel within their time limits
(:mod:`~launcher.health.runner`), the built-in checks (:mod:`~launcher.health.builtin`, the
``gpu`` check's NVML binding in :mod:`~launcher.health.nvml`), the record a sick node leaves in
the rendezvous store (:mod:`~launcher.health.board`) and what the agent calls
(:mod:`~launcher.health.gate`). See ``docs/health.md``. This package imports nothing, so a
launch that asks for no check pays nothing.
"""
