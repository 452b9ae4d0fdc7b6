"""Services for voice-agent frameworks, each an extra of its own (livekit, pipecat)."""
