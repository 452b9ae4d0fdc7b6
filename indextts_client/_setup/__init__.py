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
``_preflight``
    the cheap checks setup runs before anything is installed or deleted;
``_command``
    the ``setup`` subcommand: the steps, their progress, their errors;
``_envs``
    the ``envs`` subcommand (and the record the doctor checks when given no interpreter).
"""
