# Sources of lib/renaissance/plan (explicit list).
