"""Which plugin provided each registration, while pluggy calls the hooks.

The plugin manager calls every hook through pluggy (``manager.hook.launcher_rendezvous_backends()``),
so ``tryfirst``/``trylast`` and wrappers behave as pluggy documents them. pluggy hands back only
the results, not which plugin returned which; the manager needs that to name distributions in
conflict errors and in ``launcher plugins``. Results cannot be matched to plugins by their
position in the list (an implementation returning ``None`` adds nothing, and a wrapper may
reorder, drop or replace entries), so instead each implementation's function is replaced once,
when its plugin is registered (:func:`record_results`), by one that reports what it returned to
the manager before pluggy sees it:

- a plain implementation owns the registrations it returns; its result (often a generator) is
  turned into a list at once, so that wrappers receive lists they can read and change;
- a wrapper (``wrapper=True`` or old-style ``hookwrapper=True``) owns the registrations in the
  result it leaves behind that no implementation inside it returned: those it added, or built to
  replace another (``dataclasses.replace(reg, description=...)``).

Ownership is by identity, in a :class:`Ledger` the manager keeps for one hook call.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable
from typing import Generic, TypeVar

from pluggy import HookImpl, Result

Owner = TypeVar("Owner")

#: ``claim(result)`` checks and notes what one implementation returned, and gives the value to
#: pass on to pluggy in its place.
Claim = Callable[[object], object]


class Ledger(Generic[Owner]):
    """The owner of each registration returned during one hook call; the first claim wins."""

    def __init__(self) -> None:
        # The objects are kept so that their ids cannot be reused during the call.
        self._owners: dict[int, tuple[object, Owner]] = {}

    def claim(self, registrations: Iterable[object], owner: Owner) -> None:
        """Note ``owner`` for each registration that has none yet."""
        for registration in registrations:
            self._owners.setdefault(id(registration), (registration, owner))

    def owner(self, registration: object) -> Owner | None:
        """Who returned ``registration``, or ``None`` if no recorded implementation did."""
        found = self._owners.get(id(registration))
        return found[1] if found is not None else None


def record_results(impl: HookImpl, claim: Claim) -> None:
    """Make ``impl`` pass what it returns through ``claim`` (once, right after registration).

    pluggy keeps the function it calls in ``impl.function``; replacing it there, rather than
    wrapping the plugin object, keeps ``is_registered``/``unregister`` working on the object the
    plugin's author registered, and keeps pluggy's validation of the original signature.
    """
    function = impl.function
    recorded: Callable[..., object]
    if impl.hookwrapper:
        recorded = _old_style_wrapper(function, claim, impl.plugin_name)
    elif impl.wrapper:
        recorded = _wrapper(function, claim)
    else:

        def recorded(*args: object, **kwargs: object) -> object:
            result = function(*args, **kwargs)
            return None if result is None else claim(result)

    # HookImpl.function is declared Final for pluggy's users; the manager owns these HookImpls.
    impl.function = recorded  # type: ignore[misc]


def _wrapper(function: Callable[..., object], claim: Claim) -> Callable[..., Generator[object, object, object]]:
    """A new-style wrapper: ``yield from`` passes pluggy's ``send``/``throw`` through unchanged."""

    def recorded(*args: object, **kwargs: object) -> Generator[object, object, object]:
        inner = function(*args, **kwargs)
        assert isinstance(inner, Generator)  # pluggy checked that a wrapper is a generator function
        result = yield from inner
        return claim(result)

    return recorded


def _old_style_wrapper(
    function: Callable[..., object], claim: Claim, plugin_name: str
) -> Callable[..., Generator[object, object, None]]:
    """An old-style hookwrapper: pluggy sends it the outcome (a ``pluggy.Result``) and never throws.

    The outcome is read after the wrapper had its say, which ``yield from`` would hide.
    """

    def recorded(*args: object, **kwargs: object) -> Generator[object, object, None]:
        inner = function(*args, **kwargs)
        assert isinstance(inner, Generator)  # pluggy checked that a wrapper is a generator function
        try:
            first = next(inner)
        except StopIteration:
            raise RuntimeError(f"the hookwrapper of plugin {plugin_name!r} did not yield") from None
        outcome = yield first
        try:
            inner.send(outcome)
        except StopIteration:
            pass
        else:
            inner.close()
            raise RuntimeError(f"the hookwrapper of plugin {plugin_name!r} yielded twice")
        if isinstance(outcome, Result) and outcome.exception is None:
            outcome.force_result(claim(outcome.get_result()))

    return recorded
