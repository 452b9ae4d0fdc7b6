"""Supervision: a sidecar's lifetimes, one floor above the wire (``_wire``), below the facades.

What starts a sidecar, watches it, and starts it again; a ``Client`` holds one supervisor.
Bottom up:

``_process``
    the child process, its stderr drain, and the stop ladder (``stop_sidecar``);
``_detached``
    a task outside the caller's scopes (the supervisor's root task, a pool's healer);
``_restarts``
    the restart budget and its summary (pure, no I/O);
``_settings``
    one frozen ``SidecarSettings`` per client;
``_transports``
    how a session reaches its sidecar: a spawned process, a socket, the caller's streams
    (each one ``open()``);
``_supervisor``
    ``Supervisor``: sessions, the handshake, restarts, heartbeats, revival.
"""
