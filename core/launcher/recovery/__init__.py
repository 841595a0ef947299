"""Recovery in place: healthy workers keep their process across a failure (docs/recovery.md)."""
