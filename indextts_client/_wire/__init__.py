"""The wire: one protocol connection to a sidecar over any byte streams, and the requests on it.

No processes, no restarts: what spawns, supervises and revives a sidecar is ``_supervision``,
a floor up.  Bottom up:

``_exchange``
    one request id's inbox, state and audio; ``Channel``, the request seam a request's run uses;
``_request_run``
    a request's run: deadlines, progress, resends, cancel on abandon (on ``Channel`` alone);
``_request``
    ``Requester``: the request methods and their arguments, said once;
``_sender``
    the connection's one writer;
``_handshake``
    the ``ready`` handshake and the error a lost connection gives;
``_deadlines``
    the connection's one alarm that wakes the requests whose deadline passed;
``_connection``
    ``Connection``: frames routed by id, its lifecycle (a ``Requester`` and a ``Channel``).
"""
