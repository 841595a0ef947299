"""TorchX components for launcher: ``launcher.ddp`` and ``launcher.spmd``.

Installing this distribution registers them with TorchX (entry-point group ``torchx.components``);
TorchX's own builtins (``dist.ddp``, ``utils.echo``, ...) stay available under their usual names.
The components live in :mod:`launcher_torchx.components`; see ``docs/torchx.md``.
"""

__version__ = "0.1.0"
