"""Speech-to-text models (transcription and speech translation): the base class and its backends."""
