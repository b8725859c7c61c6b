# Sources of lib/renaissance/runtime (explicit list).
