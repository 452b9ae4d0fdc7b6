"""The voice-agent frameworks' suites (a package, so that this directory is not put on sys.path, where
its framework-named subdirectories would pass for the frameworks' own packages)."""
