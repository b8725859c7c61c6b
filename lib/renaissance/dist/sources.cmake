# Sources of lib/renaissance/dist (explicit list).
