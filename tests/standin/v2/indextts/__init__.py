"""Stand-in for upstream IndexTTS-2's ``indextts`` package (empty upstream too)."""
