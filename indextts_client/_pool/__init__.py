"""The pool: several sidecars behind one facade, on top of ``Client`` (one sidecar each).

``_routing``
    ``Router`` and ``Member``: which member takes the next request (one lock, no I/O under it);
    each member's devices (``device_env``);
``_stream``
    a streamed request on a pool: another member if one fails before any audio;
``_mps``
    a pool's private NVIDIA MPS control daemon: start, who attached, stop;
``_pool``
    ``Pool`` (its members, limits, healing and retries) and ``PoolStream``;
``_cli``
    the pool's command-line options, defined once for ``serve`` and ``wyoming``.
"""
