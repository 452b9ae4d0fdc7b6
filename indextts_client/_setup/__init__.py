"""``indextts-client setup``: build an IndexTTS engine venv, fetch its checkpoints, register it.

A tool on the top floor: it runs the doctor, and the ``Client`` the CLI hands it for the test
synthesis (``setup_command_main(args, Client)``), so that it imports no layer of the client.
The records it writes and the discovery ``Client`` asks live one floor down, in
``indextts_client._registry``, so that nothing below the tools imports this folder.

``_build``
    the interpreter, the venv, upstream's code, torch and this distribution (uv or pip, in
    subprocesses);
``_hub``
    the checkpoints and the auxiliary models, with huggingface_hub;
``_preflight``
    the cheap checks setup runs before anything is installed or deleted;
``_command``
    the ``setup`` subcommand: the steps, their progress, their errors;
``_envs``
    the ``envs`` subcommand (and the record the doctor checks when given no interpreter).
"""
