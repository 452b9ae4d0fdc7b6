"""The request signature, written once and borrowed by every facade.

``Requester`` (``_wire/_request.py``) writes the parameters of ``synthesize``, ``stream`` and
``request`` once, and ``Client`` those of ``stream_text``.  :class:`Pool`, :class:`BlockingClient`
and :class:`RayClient` forward those calls and declare only the first positional parameter,
the keyword-only parameters they use themselves (``stream_text``'s ``lookahead``) and
``**kwargs``; :func:`same_parameters` gives them the source's parameters, for the type checker
(a ``ParamSpec``) and for :func:`inspect.signature` and ``help()`` alike, so that a parameter
added to ``Requester`` reaches every facade and none drifts.

The sources are bound methods of the two instances below: a bound method's signature has no
``self``, which is what a facade borrows (an unbound function's named ``self`` together with
its ``**keywords`` cannot be typed as "any first argument, then these").
"""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Concatenate, Final, ParamSpec, TypeVar

from ._client import Client
from ._wire._request import Requester, merge_options

__all__ = ["CLIENT", "REQUESTER", "merge_options", "same_parameters"]

P = ParamSpec("P")
R = TypeVar("R")
S = TypeVar("S")

#: Only their bound methods are read.  A bare Requester has no connection to send on, and this
#: Client's ``__init__`` never ran: neither can start a sidecar or send anything.
REQUESTER: Final = Requester()
CLIENT: Final = Client.__new__(Client)


def same_parameters(
    source: Callable[P, object],
) -> Callable[[Callable[Concatenate[S, ...], R]], Callable[Concatenate[S, P], R]]:
    """Give the decorated method ``source``'s parameters (after its own ``self``) and keep its return type.

    The method itself is returned, with ``__signature__`` set: calling it costs nothing extra.
    """
    parameters = list(inspect.signature(source).parameters.values())

    def decorate(method: Callable[Concatenate[S, ...], R]) -> Callable[Concatenate[S, P], R]:
        own = inspect.signature(method)
        self_parameter, *forwarded = own.parameters.values()
        # The method must accept at run time what its borrowed signature promises: the source's
        # positional parameters by name, and everything else through its **kwargs, except the
        # keyword-only ones it names itself (a pipeline's settings), each with the source's default.
        positional = [p.name for p in parameters if p.kind is p.POSITIONAL_OR_KEYWORD]
        source = {p.name: p for p in parameters}
        named = [p for p in forwarded if p.kind is p.KEYWORD_ONLY]
        shape = ["**" if p.kind is p.VAR_KEYWORD else p.name for p in forwarded if p.kind is not p.KEYWORD_ONLY]
        if shape != [*positional, "**"]:
            raise TypeError(
                f"{method.__qualname__} must take (self, {', '.join(positional)}, **kwargs) to forward them"
            )
        for p in named:
            if p.name not in source or source[p.name].default != p.default:
                raise TypeError(f"{method.__qualname__}'s {p.name} must be the source's, with its default")
        signature = own.replace(parameters=[self_parameter, *parameters])
        method.__signature__ = signature  # type: ignore[attr-defined]
        return method

    return decorate
