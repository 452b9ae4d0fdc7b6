"""``indextts-client setup``: build an IndexTTS engine venv, fetch its checkpoints, register it.

``_registry``
    the environments set up so far (one record per engine under ``INDEXTTS_HOME``) and the
    discovery every entry point uses when given no interpreter and no checkpoint directory;
    imports only the standard library and msgspec, so that ``Client`` can use it.
``_build``
    the interpreter, the venv, upstream's code, torch and this distribution (uv or pip, in
    subprocesses);
``_hub``
    the checkpoints and the auxiliary models, with huggingface_hub;
``_command``
    the ``setup`` and ``envs`` subcommands: the steps, their progress, their errors.
"""
