"""oneDNN kernel provider for the CPU backend (work in progress in this session)."""
