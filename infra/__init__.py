"""Starting and stopping the real components locally, JVM dependency manifests, and settings."""
