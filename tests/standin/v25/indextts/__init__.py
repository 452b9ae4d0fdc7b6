"""Stand-in for upstream IndexTTS-2.5's ``indextts`` package (empty upstream too)."""
