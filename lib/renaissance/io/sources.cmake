# Sources of lib/renaissance/io (explicit list).
